// One end of an engine's ZeroMQ connection, as a Node process moves its bytes: a Unix
// socket to a peer (argv[2] is its path), connected before a recorder attaches. Each line
// of stdin is "send HEX" (one write) or "recv N" (wait until N more bytes arrived); each
// answered "ok".
"use strict";
const net = require("net");
const readline = require("readline");

let received = 0; // bytes arrived and not yet waited for
let wanted = null;
function fulfil() {
  if (wanted !== null && received >= wanted) {
    received -= wanted;
    wanted = null;
    console.log("ok");
  }
}
const conn = net.connect(process.argv[2], () => console.log("ready"));
conn.on("data", (chunk) => {
  received += chunk.length;
  fulfil();
});
readline.createInterface({ input: process.stdin }).on("line", (line) => {
  const [verb, arg] = line.split(" ");
  if (verb === "send") {
    conn.write(Buffer.from(arg, "hex"), () => console.log("ok"));
    return;
  }
  wanted = Number(arg);
  fulfil();
});
