// An engine's own IPC, as a Node process does it: binary frames over a Unix socket to a
// peer process (argv[2] is its path). Prints "ready" once connected, then on each line of
// stdin sends one 64-byte frame and reads the echo; "close" closes the connection.
"use strict";
const net = require("net");
const readline = require("readline");

const conn = net.connect(process.argv[2], () => console.log("ready"));
const frame = Buffer.alloc(64, 0xab);
readline.createInterface({ input: process.stdin }).on("line", (line) => {
  if (line === "close") {
    conn.end(() => console.log("closed"));
    return;
  }
  conn.write(frame);
  conn.once("data", () => console.log("echoed"));
});
