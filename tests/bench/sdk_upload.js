// Baseline for the checkpoint benchmark: uploads FILE to s3rver with the
// AWS SDK's multipart Upload (lib-storage) and prints the MB/s.
//   node sdk_upload.js MODULE_DIR ENDPOINT BUCKET KEY FILE
'use strict';
const path = require('path');
const fs = require('fs');
const [modDir, endpoint, bucket, key, file] = process.argv.slice(2);
const { S3Client } = require(path.join(modDir, '@aws-sdk/client-s3'));
const { Upload } = require(path.join(modDir, '@aws-sdk/lib-storage'));
const s3 = new S3Client({
  endpoint, region: 'us-east-1', forcePathStyle: true,
  credentials: { accessKeyId: 'S3RVER', secretAccessKey: 'S3RVER' },
});
const bytes = fs.statSync(file).size;
const t0 = process.hrtime.bigint();
new Upload({
  client: s3, queueSize: 4, partSize: 16 * 1024 * 1024,
  params: { Bucket: bucket, Key: key, Body: fs.createReadStream(file) },
}).done().then(() => {
  const s = Number(process.hrtime.bigint() - t0) / 1e9;
  process.stdout.write(`${(bytes / 1e6 / s).toFixed(1)}\n`);
}).catch((e) => { console.error(e); process.exit(1); });
