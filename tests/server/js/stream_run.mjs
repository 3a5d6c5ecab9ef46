// The npm @langchain/langgraph-sdk client against a Loom server: create a thread, stream one
// run on it, read the thread back, and print what it saw as one JSON object.
// Usage: node stream_run.mjs http://127.0.0.1:8000 [assistant] [message]
import { Client } from "@langchain/langgraph-sdk";

const [url, assistant = "calc", message = "add 2 3"] = process.argv.slice(2);
if (!url) {
  console.error("usage: node stream_run.mjs URL [assistant] [message]");
  process.exit(2);
}
const client = new Client({ apiUrl: url });

const assistants = await client.assistants.search({ limit: 10 });
const thread = await client.threads.create({ metadata: { client: "langgraph-sdk-js" } });
const events = [];
const deltas = [];
let values = null;
let runId = null;
for await (const chunk of client.runs.stream(thread.thread_id, assistant, {
  input: { messages: [{ role: "user", content: message }] },
  streamMode: ["values", "messages-tuple", "updates"],
})) {
  events.push(chunk.event);
  if (chunk.event === "metadata") runId = chunk.data.run_id;
  if (chunk.event === "values") values = chunk.data;
  if (chunk.event === "messages") {
    const [msg] = chunk.data;
    if (msg.type === "AIMessageChunk" && typeof msg.content === "string") deltas.push(msg.content);
  }
}
const state = await client.threads.getState(thread.thread_id);
const run = await client.runs.get(thread.thread_id, runId);
const last = values.messages[values.messages.length - 1];
console.log(JSON.stringify({
  assistants: assistants.map((a) => a.graph_id),
  thread_id: thread.thread_id,
  run_id: runId,
  run_status: run.status,
  events: [...new Set(events)],
  answer: last.content,
  message_types: values.messages.map((m) => m.type),
  deltas: deltas.join(""),
  state_messages: state.values.messages.length,
}));
