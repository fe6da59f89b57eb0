// The shared end of the Node SDK clients (openai_node_client.mjs, gemini_node_client.mjs):
// one warm-up call, "ready", a wait for a line on stdin (a tracer attaches meanwhile),
// then the measured calls, one JSON line each.
import readline from "node:readline";

// CLOCK_MONOTONIC ns as a string (process.hrtime is libuv's uv_hrtime; a BigInt has no JSON form).
export const now = () => process.hrtime.bigint().toString();

export async function runTimedCalls(call, calls) {
  // A first call warms the SDK up (its modules, its transport) before the measured ones.
  await call(-1);
  console.log("ready");
  const lines = readline.createInterface({ input: process.stdin });
  await new Promise((resolve) => lines.once("line", resolve));
  lines.close();
  for (let k = 0; k < calls; k++) console.log(JSON.stringify(await call(k)));
}
