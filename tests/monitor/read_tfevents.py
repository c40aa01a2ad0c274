"""Reads a TensorBoard event file without any of cohort's code.

  read_tfevents.py FILE

Checks the TFRecord framing (both masked CRC-32Cs of every record, computed
here bit by bit, independently of the writer's table), decodes each Event with
Debian's python3-protobuf from message descriptors declared below with the
field numbers of tensorflow/core/util/event.proto and
tensorflow/core/framework/summary.proto, and prints one JSON object:

  {"records": N, "file_version": "...", "first_wall_time": T,
   "scalars": [{"tag": ..., "step": ..., "wall_time": ..., "value": ...,
                "bits": <the float32's bits as an unsigned integer>}, ...]}

Exits 1 with a message on stderr if a CRC, a length or a message is wrong.
"""
import json
import struct
import sys

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

F = descriptor_pb2.FieldDescriptorProto


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(crc):
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def add_field(message, name, number, ftype, label=F.LABEL_OPTIONAL, type_name=None):
    f = message.field.add(name=name, number=number, type=ftype, label=label)
    if type_name:
        f.type_name = type_name


def event_class():
    fd = descriptor_pb2.FileDescriptorProto(name="cohort_test_event.proto", package="tensorflow",
                                            syntax="proto3")
    summary = fd.message_type.add(name="Summary")
    value = summary.nested_type.add(name="Value")
    add_field(value, "tag", 1, F.TYPE_STRING)
    add_field(value, "simple_value", 2, F.TYPE_FLOAT)
    add_field(summary, "value", 1, F.TYPE_MESSAGE, F.LABEL_REPEATED, ".tensorflow.Summary.Value")
    event = fd.message_type.add(name="Event")
    add_field(event, "wall_time", 1, F.TYPE_DOUBLE)
    add_field(event, "step", 2, F.TYPE_INT64)
    add_field(event, "file_version", 3, F.TYPE_STRING)
    add_field(event, "summary", 5, F.TYPE_MESSAGE, type_name=".tensorflow.Summary")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    descriptor = pool.FindMessageTypeByName("tensorflow.Event")
    if hasattr(message_factory, "GetMessageClass"):  # protobuf >= 4.22
        return message_factory.GetMessageClass(descriptor)
    return message_factory.MessageFactory(pool).GetPrototype(descriptor)


def records(data):
    pos = 0
    index = 0
    while pos < len(data):
        if len(data) - pos < 12:
            raise ValueError(f"record {index} at byte {pos}: truncated header")
        header = data[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", data[pos + 8:pos + 12])
        if masked(crc32c(header)) != length_crc:
            raise ValueError(f"record {index} at byte {pos}: length CRC mismatch")
        start = pos + 12
        end = start + length
        if end + 4 > len(data):
            raise ValueError(f"record {index} at byte {pos}: truncated data ({length} bytes)")
        payload = data[start:end]
        (data_crc,) = struct.unpack("<I", data[end:end + 4])
        if masked(crc32c(payload)) != data_crc:
            raise ValueError(f"record {index} at byte {pos}: data CRC mismatch")
        yield payload
        pos = end + 4
        index += 1


def main():
    with open(sys.argv[1], "rb") as f:
        data = f.read()
    Event = event_class()
    out = {"records": 0, "file_version": None, "first_wall_time": None, "scalars": []}
    try:
        for payload in records(data):
            event = Event()
            event.ParseFromString(payload)
            if out["records"] == 0:
                out["file_version"] = event.file_version
                out["first_wall_time"] = event.wall_time
            out["records"] += 1
            for v in event.summary.value:
                bits = struct.unpack("<I", struct.pack("<f", v.simple_value))[0]
                value = v.simple_value
                out["scalars"].append({"tag": v.tag, "step": event.step,
                                       "wall_time": event.wall_time,
                                       "value": value if value == value and abs(value) != float("inf")
                                       else repr(value),
                                       "bits": bits})
    except Exception as e:  # a bad CRC, a truncated record, an undecodable message
        print(f"read_tfevents.py: {sys.argv[1]}: {e}", file=sys.stderr)
        return 1
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
