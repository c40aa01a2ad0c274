#!/usr/bin/python3
"""Seeds for the sealed fuzz target, written from docs/security.md's format
by a second implementation (Python's cryptography), so that the seeds also
check that the document and src/security/sealed.cc agree.

    /usr/bin/python3 fuzz/make_sealed_seeds.py fuzz/corpus/sealed
"""
import os
import struct
import sys

from cryptography.hazmat.primitives.ciphers.aead import AESGCM
import hashlib

KEY = bytes(range(32))
LABEL = b"step-1/model.bin"


def seal(plain, chunk, version=1):
    """Version 1 authenticates the whole header; version 2 (streamed) the
    header with its plaintext size zeroed."""
    key_id = hashlib.sha256(b"cohort key id v1\0" + KEY).digest()[:16]
    file_id = os.urandom(16)
    header = b"COHORTSE" + struct.pack("<IIQ", version, chunk, len(plain)) + key_id + file_id + bytes(8)
    authenticated = header if version == 1 else header[:16] + bytes(8) + header[24:]
    chunks = max(1, -(-len(plain) // chunk))
    out = header
    for i in range(chunks):
        part = plain[i * chunk:(i + 1) * chunk]
        aad = authenticated + struct.pack("<I", len(LABEL)) + LABEL + struct.pack("<QB", i, i + 1 == chunks)
        nonce = os.urandom(12)
        out += nonce + AESGCM(KEY).encrypt(nonce, part, aad)  # ciphertext then tag
    return out


def main():
    dst = sys.argv[1]
    seeds = {"empty": (b"", 64), "one-chunk": (b"cohort tensors" * 4, 64),
             "three-chunks": (bytes(range(200)), 64), "exact-chunks": (b"x" * 128, 64)}
    for name, (plain, chunk) in seeds.items():
        with open(os.path.join(dst, name), "wb") as f:
            f.write(seal(plain, chunk))
    with open(os.path.join(dst, "streamed-three-chunks"), "wb") as f:
        f.write(seal(bytes(range(150)), 64, version=2))


if __name__ == "__main__":
    main()
