"""Message classes built at run time from the build's descriptor set
(stoker.protoset), with no generated code, as grpcurl -protoset would: what
the independent Python checks (wire_python.py, test_ckpt_boto3.py) share."""

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory


def load_pool(path):
    fds = descriptor_pb2.FileDescriptorSet()
    with open(path, "rb") as f:
        fds.ParseFromString(f.read())
    pool = descriptor_pool.DescriptorPool()
    for fdp in fds.file:
        pool.Add(fdp)
    return pool


def message_class(pool, name):
    desc = pool.FindMessageTypeByName(name)
    if hasattr(message_factory, "GetMessageClass"):
        return message_factory.GetMessageClass(desc)
    return message_factory.MessageFactory(pool).GetPrototype(desc)
