// Starts s3rver for the S3 client tests: node s3rver_launch.js MODULE_DIR DATA_DIR BUCKET [ADDRESS].
// Listens on ADDRESS (default 127.0.0.1; the deploy suite gives the pod network's gateway)
// with an ephemeral port, prints "PORT <n>" once ready, and exits
// when its stdin closes (the test process died) or on SIGTERM. With S3RVER_REQUEST_LOG set, every
// request is appended to that file as it arrives, one line "METHOD URL RANGE" (RANGE "-" when
// the request has none): the tests and the bench count requests there.
'use strict';
const fs = require('fs');
const path = require('path');
const [moduleDir, dataDir, bucket, address = '127.0.0.1'] = process.argv.slice(2);
const S3rver = require(path.join(moduleDir, 'lib', 's3rver.js'));
const server = new S3rver({
  address,
  port: 0,
  silent: true,
  directory: dataDir,
  serviceEndpoint: 'localhost',
  configureBuckets: [{ name: bucket, configs: [] }],
});
server.run().then(({ port }) => {
  const log = process.env.S3RVER_REQUEST_LOG;
  if (log) {
    server.httpServer.on('request', (req) => {
      fs.appendFileSync(log, `${req.method} ${req.url} ${req.headers.range || '-'}\n`);
    });
  }
  process.stdout.write(`PORT ${port}\n`);
});
const stop = () => server.close().finally(() => process.exit(0));
process.stdin.on('end', stop);
process.stdin.resume();
process.on('SIGTERM', stop);
