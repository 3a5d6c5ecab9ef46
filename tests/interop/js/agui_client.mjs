// Drives a Loom server's AG-UI endpoint with @ag-ui/client's HttpAgent, which verifies the
// event order itself (a stream out of order rejects the run). Prints one JSON line per run:
// the event types seen, the run's result, its new messages; exits 1 with the error otherwise.
// usage: node agui_client.mjs <url> <scenario>
//   (scenarios: text, tools, frontend, bad, media, reasoning, toolmedia)
// (media: the base64 of a PNG and a PDF in the env vars AGUI_PNG and AGUI_PDF; media,
// reasoning and toolmedia send the API key in LOOM_KEY, if set, as x-api-key)
import { HttpAgent } from "@ag-ui/client";

const [url, scenario] = process.argv.slice(2);

async function run(agent, params) {
  const types = [];
  let finished = null;
  const { result, newMessages } = await agent.runAgent(params, {
    onEvent({ event }) {
      types.push(event.type);
      if (event.type === "RUN_FINISHED") finished = event;
    },
  });
  return { types, result, outcome: finished?.outcome ?? null, newMessages };
}

function say(agent, text) {
  agent.addMessage({ id: `u${Math.random().toString(36).slice(2)}`, role: "user", content: text });
}

const out = [];
try {
  if (scenario === "text" || scenario === "tools") {
    const agent = new HttpAgent({ url, threadId: `t-${scenario}-${Date.now()}` });
    say(agent, scenario === "text" ? "hello there" : "add 2 3");
    out.push(await run(agent, {}));
  } else if (scenario === "frontend") {
    const agent = new HttpAgent({ url, threadId: `t-fe-${Date.now()}` });
    const tools = [{
      name: "pick_color",
      description: "Ask the user to pick a color in the browser.",
      parameters: { type: "object", properties: { prompt: { type: "string" } } },
    }];
    say(agent, "choose a color");
    const first = await run(agent, { tools });
    out.push(first);
    // the application runs the frontend tool and answers the call in the next input
    const pending = first.outcome?.pendingToolCallIds ?? [];
    for (const id of pending) {
      agent.addMessage({ id: `tool-${id}`, role: "tool", toolCallId: id, content: "teal" });
    }
    out.push(await run(agent, { tools }));
  } else if (scenario === "media") {
    const headers = process.env.LOOM_KEY ? { "x-api-key": process.env.LOOM_KEY } : {};
    const agent = new HttpAgent({ url, headers, threadId: `t-media-${Date.now()}` });
    agent.addMessage({
      id: `u${Math.random().toString(36).slice(2)}`,
      role: "user",
      content: [
        { type: "text", text: "what are these?" },
        { type: "image", source: { type: "data", value: process.env.AGUI_PNG, mimeType: "image/png" } },
        {
          type: "document",
          source: { type: "data", value: process.env.AGUI_PDF, mimeType: "application/pdf" },
          metadata: { filename: "report.pdf" },
        },
        { type: "image", source: { type: "url", value: "https://example.com/cat.jpg" } },
      ],
    });
    out.push(await run(agent, {}));
  } else if (scenario === "reasoning" || scenario === "toolmedia") {
    // an answer's reasoning (its own message, role "reasoning") and a tool's image
    const headers = process.env.LOOM_KEY ? { "x-api-key": process.env.LOOM_KEY } : {};
    const agent = new HttpAgent({ url, headers, threadId: `t-${scenario}-${Date.now()}` });
    say(agent, scenario === "reasoning" ? "what is six times seven?" : "take a picture of the sea");
    out.push(await run(agent, {}));
  } else if (scenario === "bad") {
    const agent = new HttpAgent({ url, threadId: `t-bad-${Date.now()}` });
    out.push(await run(agent, {})); // no user message at all
  } else {
    throw new Error(`unknown scenario ${scenario}`);
  }
  console.log(JSON.stringify({ ok: true, runs: out }));
} catch (err) {
  console.log(JSON.stringify({ ok: false, error: String(err?.message ?? err), runs: out }));
  process.exit(1);
}
