#!/usr/bin/python3
"""Proves the coordinator speaks standard gRPC: a second, independent client
(Debian's python3-grpcio, with messages built at run time from the
stoker.protoset descriptor set the build produces, exactly as grpcurl
-protoset would) calls the real daemon on loopback.

Usage: wire_python.py COORDINATOR_BINARY PROTOSET
"""

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
from protoset import load_pool, message_class


class Client:
    def __init__(self, pool, channel):
        self.pool = pool
        self.channel = channel

    def call(self, service, method, request_fields, timeout=5):
        sdesc = self.pool.FindServiceByName(service)
        mdesc = sdesc.FindMethodByName(method)
        req_cls = message_class(self.pool, mdesc.input_type.full_name)
        resp_cls = message_class(self.pool, mdesc.output_type.full_name)
        req = req_cls(**request_fields)
        stub = self.channel.unary_unary(
            f"/{service}/{method}",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=resp_cls.FromString,
        )
        return stub(req, timeout=timeout)


def expect_code(fn, code):
    try:
        fn()
    except grpc.RpcError as e:
        assert e.code() == code, f"expected {code}, got {e.code()}: {e.details()}"
        return e.details()
    raise AssertionError(f"expected {code}, call succeeded")


def main():
    daemon, protoset = sys.argv[1], sys.argv[2]
    pool = load_pool(protoset)
    with tempfile.TemporaryDirectory() as tmp:
        ready = os.path.join(tmp, "ready")
        proc = subprocess.Popen(
            [
                daemon,
                "--listen",
                "127.0.0.1:0",
                "--data-dir",
                os.path.join(tmp, "data"),
                "--ready-file",
                ready,
            ]
        )
        try:
            deadline = time.time() + 30
            while not (os.path.exists(ready) and Path(ready).read_text().strip()):
                assert proc.poll() is None, "daemon exited early"
                assert time.time() < deadline, "daemon not ready in 30 s"
                time.sleep(0.05)
            addr = Path(ready).read_text().strip()
            channel = grpc.insecure_channel(addr)
            c = Client(pool, channel)

            health = c.call("grpc.health.v1.Health", "Check", {"service": ""})
            assert health.status == 1, f"health status {health.status}"
            print("ok health Check SERVING")

            spec = {"name": "wire-job", "min_ranks": 1, "max_ranks": 2, "labels": {"team": "llm"}}
            spec_cls = message_class(pool, "stoker.v1.JobSpec")
            job = c.call("stoker.v1.Coordinator", "CreateJob", {"spec": spec_cls(**spec)})
            assert job.spec.name == "wire-job" and job.spec.max_ranks == 2
            assert job.spec.heartbeat_interval_ms == 5000, job.spec.heartbeat_interval_ms
            print("ok CreateJob, defaults filled")

            got = c.call("stoker.v1.Coordinator", "GetJob", {"job": "wire-job"})
            assert got.spec.labels["team"] == "llm"
            listed = c.call("stoker.v1.Coordinator", "ListJobs", {})
            assert [j.spec.name for j in listed.jobs] == ["wire-job"]
            print("ok GetJob and ListJobs")

            expect_code(
                lambda: c.call("stoker.v1.Coordinator", "GetJob", {"job": "nope"}),
                grpc.StatusCode.NOT_FOUND,
            )
            expect_code(
                lambda: c.call(
                    "stoker.v1.Coordinator",
                    "CreateJob",
                    {"spec": spec_cls(name="Bad/Name", min_ranks=1, max_ranks=1)},
                ),
                grpc.StatusCode.INVALID_ARGUMENT,
            )
            print("ok NOT_FOUND and INVALID_ARGUMENT")

            raw = channel.unary_unary("/stoker.v1.Coordinator/NoSuchMethod")
            expect_code(lambda: raw(b"", timeout=5), grpc.StatusCode.UNIMPLEMENTED)
            garbage = channel.unary_unary("/stoker.v1.Coordinator/GetJob")
            expect_code(
                lambda: garbage(b"\xff\xff\xff", timeout=5), grpc.StatusCode.INVALID_ARGUMENT
            )
            print("ok UNIMPLEMENTED and malformed payload")
            channel.close()
        finally:
            proc.terminate()
            rc = proc.wait(timeout=30)
        assert rc == 0, f"daemon exit status {rc} after SIGTERM"
        print("ok graceful exit on SIGTERM")


if __name__ == "__main__":
    main()
