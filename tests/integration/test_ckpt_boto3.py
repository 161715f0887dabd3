#!/usr/bin/python3
"""An independent S3 reader (Debian's python3-boto3) checks what
stoker-checkpoint wrote to s3rver: it finds the manifest by listing the
job's prefix, parses it with the build's descriptor set (no generated
code), and checks every object's size and per-1-MiB-block CRC32C.
Usage: test_ckpt_boto3.py PROTOSET ENDPOINT BUCKET PREFIX JOB STEP"""

import sys

try:
    import boto3
    from botocore.config import Config
except ImportError:
    print("python3-boto3 is not installed (deploy/install-deps.sh): skipped")
    sys.exit(77)
from protoset import load_pool, message_class


def crc32c(data, crc=0):
    """Bitwise CRC32C (Castagnoli, reflected 0x82F63B78): slow and obvious."""
    table = getattr(crc32c, "table", None)
    if table is None:
        table = []
        for i in range(256):
            c = i
            for _ in range(8):
                c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
            table.append(c)
        crc32c.table = table
    crc ^= 0xFFFFFFFF
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def main():
    protoset, endpoint, bucket, prefix, job, step = sys.argv[1:7]
    assert crc32c(b"123456789") == 0xE3069283, "CRC32C self-test"
    s3 = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="S3RVER",
        aws_secret_access_key="S3RVER",
        config=Config(s3={"addressing_style": "path"}),
    )
    base = f"{prefix}{job}/step-{int(step):012d}/"
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=base).get("Contents", [])]
    manifests = [k for k in keys if k.endswith("/manifest.pb")]
    assert len(manifests) == 1, f"manifests under {base}: {keys!r}"
    Manifest = message_class(load_pool(protoset), "stoker.v1.Manifest")
    m = Manifest()
    m.ParseFromString(s3.get_object(Bucket=bucket, Key=manifests[0])["Body"].read())
    assert m.job == job and m.step == int(step), (m.job, m.step)
    adir = manifests[0][: -len("manifest.pb")]
    block = m.crc_block_bytes or 1 << 20
    total = 0
    for o in m.objects:
        body = s3.get_object(Bucket=bucket, Key=adir + o.key)["Body"].read()
        assert len(body) == o.size, (o.key, len(body), o.size)
        crcs = [crc32c(body[i : i + block]) for i in range(0, len(body), block)]
        assert crcs == list(o.block_crc32c), "CRC32C mismatch in " + o.key
        total += len(body)
    print(f"ok {len(m.objects)} objects, {total} bytes, {len(m.chunks)} chunks verified by boto3")


if __name__ == "__main__":
    main()
