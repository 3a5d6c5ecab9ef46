// The npm @langchain/langgraph-sdk's thread streaming (client.threads.stream) against a real
// `loom serve`: node thread_stream.mjs URL ASSISTANT MESSAGE prints one JSON line.
import { Client } from "@langchain/langgraph-sdk";

const [url, assistant, text] = process.argv.slice(2);
const client = new Client({ apiUrl: url });
const thread = client.threads.stream(undefined, { assistantId: assistant });
const started = await thread.run.start({ input: { messages: [{ role: "user", content: text }] } });
const output = await thread.output;
console.log(
  JSON.stringify({
    thread_id: thread.threadId,
    run_id: started.run_id,
    messages: output.messages.map((m) => m.content),
    count: await client.threads.count(),
  }),
);
await thread.close?.();
