// A Node http client that sends one request with a traceparent after 1.5 KB of
// headers once a line arrives on stdin (the recorder has attached). Node writes
// the headers and body in one writev() iovec. Usage: node traceparent_node_client.js PORT TRACE PARENT
const http = require('http');
const [port, trace, parent] = process.argv.slice(2);
process.stdin.once('data', () => {
  const body = JSON.stringify({model: 'm', tokens: 3, prompt: 'hello', interval_ms: 1});
  const headers = {'content-type': 'application/json', 'x-filler': 'f'.repeat(1500),
                   'traceparent': `00-${trace}-${parent}-01`, 'content-length': Buffer.byteLength(body)};
  const req = http.request({host: '127.0.0.1', port: +port, method: 'POST', path: '/v1/chat/completions',
                            headers}, (res) => {
    res.resume();
    res.on('end', () => { console.log('done'); process.exit(0); });
  });
  req.end(body);
});
