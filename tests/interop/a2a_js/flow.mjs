// The @a2a-js/sdk client against a real `loom serve` (tests/interop/test_a2a_js.py):
// fetch the card, send a message, continue its context, stream a task, get it, cancel one,
// answer a task parked for approval with free text.
// Usage: node flow.mjs BASE_URL API_KEY; prints one JSON object for the test to check.
import { Role } from "@a2a-js/sdk";
import { ClientFactory, DefaultAgentCardResolver, JsonRpcTransportFactory } from "@a2a-js/sdk/client";

const [base, key] = process.argv.slice(2);
const fetchImpl = (url, init = {}) => {
  const headers = new Headers(init.headers || {});
  headers.set("Authorization", `Bearer ${key}`);
  return fetch(url, { ...init, headers });
};
const factory = new ClientFactory({
  transports: [new JsonRpcTransportFactory({ fetchImpl })],
  cardResolver: new DefaultAgentCardResolver({ fetchImpl }),
});

let n = 0;
const message = (text, extra = {}) => ({
  message: {
    messageId: `js-${process.pid}-${n++}`, contextId: "", taskId: "", role: Role.ROLE_USER,
    parts: [{ content: { $case: "text", value: text } }], metadata: undefined,
    extensions: [], referenceTaskIds: [], ...extra,
  },
});
const text = (parts) => (parts || []).map((p) => (p.content?.$case === "text" ? p.content.value : "")).join("");
const task = (r) => (r && r.id ? r : r?.task ?? r?.payload?.value ?? r);

const out = {};
const calc = await factory.createFromUrl(`${base}/agents/calc/.well-known/agent-card.json`, "");
const card = await calc.getAgentCard();
out.card = { name: card.name, skills: card.skills.map((s) => s.id), streaming: card.capabilities?.streaming };

const first = task(await calc.sendMessage(message("add 2 3")));
out.first = { id: first.id, contextId: first.contextId, state: first.status.state,
              answer: text(first.artifacts?.[0]?.parts) };
const second = task(await calc.sendMessage(message("hello again", { contextId: first.contextId })));
out.second = { contextId: second.contextId, answer: text(second.artifacts?.[0]?.parts) };

out.stream = [];
for await (const event of calc.sendMessageStream(message("add 40 2"))) {
  const kind = event.payload?.$case;
  const value = event.payload?.value;
  out.stream.push({ kind, state: value?.status?.state ?? null,
                    text: kind === "artifactUpdate" ? text(value.artifact.parts) : text(value?.status?.message?.parts) });
}

const got = await calc.getTask({ id: first.id, tenant: "", historyLength: undefined });
out.got = { id: got.id, state: got.status.state, answer: text(got.artifacts?.[0]?.parts) };

const waiter = await factory.createFromUrl(`${base}/agents/waiter/.well-known/agent-card.json`, "");
const parked = task(await waiter.sendMessage({ ...message("wait for never-js.txt"),
  configuration: { acceptedOutputModes: [], taskPushNotificationConfig: undefined,
                   historyLength: undefined, returnImmediately: true } }));
const cancelled = await waiter.cancelTask({ id: parked.id, tenant: "", metadata: undefined });
out.cancel = { id: parked.id, before: parked.status.state, after: cancelled.status.state };
// a task parked for approval, continued with free text (a rejection with that reason)
const ops = await factory.createFromUrl(`${base}/agents/ops/.well-known/agent-card.json`, "");
const asked = task(await ops.sendMessage(message("ship it")));
const replied = task(await ops.sendMessage(message("not today", { taskId: asked.id })));
out.parked = { before: asked.status.state, after: replied.status.state, sameTask: replied.id === asked.id,
               answer: text(replied.artifacts?.[replied.artifacts.length - 1]?.parts) };
console.log(JSON.stringify(out));
