"""tools/java_text.py: console-producer input as Kafka's LineMessageReader turns it into record
bytes (InputStreamReader(UTF-8), then getBytes(UTF-8)). The table's bytes are what the JVM gave;
the differential test compares random lines with the JVM when a JDK is installed."""
import random

import pytest

from jvm_harness import JavaHarness, needs_jdk
from kstore.tools.java_text import as_java_text, malformed_length

R = b"\xef\xbf\xbd"       # U+FFFD
# input (ending the stream) -> the JVM's bytes
JAVA = [
    (b"plain ascii", b"plain ascii"),
    (b"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", b"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"),
    (b"\xed\xa0\x80", R),                         # an encoded surrogate: one (Python: three)
    (b"\xe0\x80", R + R),                         # E0 needs A0-BF next
    (b"\xe2\x82", R),                             # truncated at the end of input: one
    (b"\xe2\x82a", R + b"a"),
    (b"\xf0\x9f\x98", R),
    (b"\xf0\x9f\x98a", R + b"a"),
    (b"\xf0\x8f\x80\x80", R * 4),                 # overlong 4-byte form
    (b"\xf4\x90\x80\x80", R * 4),                 # past U+10FFFF
    (b"\xf5\x80\x80\x80", R * 4),
    (b"\xc0\x80\xc1\xbf", R * 4),
    (b"\xff\xfe", R + R),
    (b"\x85", R),
]


@pytest.mark.parametrize("data,expected", JAVA)
def test_what_the_jvm_sends(data, expected):
    assert as_java_text(data, len(data)) == expected


def test_only_the_given_lines_are_converted_and_valid_text_is_not_copied():
    data = b"ok\n\xe2\x82"                        # the tail may complete in the next read
    assert as_java_text(data, 3) == data
    valid = "z\u00e9\n".encode() * 1000
    assert as_java_text(valid, len(valid)) is valid
    assert malformed_length(b"\xed\xa0\x80", 0) == 3 and malformed_length(b"\xe2\x82x", 0) == 2


_JAVA = """
import java.io.*; import java.nio.charset.StandardCharsets;
public class Lines {
  public static void main(String[] a) throws Exception {
    BufferedReader r = new BufferedReader(new InputStreamReader(new FileInputStream(a[0]), StandardCharsets.UTF_8));
    String line; StringBuilder out = new StringBuilder();
    while ((line = r.readLine()) != null) {
      for (byte b : line.getBytes(StandardCharsets.UTF_8)) out.append(String.format("%02x", b));
      out.append("\\n");
    }
    System.out.print(out);
  }
}
"""


@needs_jdk
def test_random_lines_as_the_jvm_reads_them(tmp_path):
    """600 lines of valid, truncated, overlong, surrogate and out-of-range sequences in one
    stream (each malformed sequence decided by the bytes after it, a line end included), and
    60 streams ending inside a sequence: kstore's bytes equal the JVM's."""
    harness = JavaHarness(tmp_path, "Lines", _JAVA)
    pieces = [b"a", b"\xc3\xa9", b"\xc3", b"\xa9", b"\xe2\x82\xac", b"\xe2\x82", b"\xe0\x80",
              b"\xe0\xa0\x80", b"\xef\xbf\xbf", b"\xf0\x9f\x98\x80", b"\xf0\x9f", b"\xf0\x8f\x80\x80",
              b"\xf0\x9f\x98", b"\xed\xa0\x80", b"\xed\x9f\xbf", b"\xc0\x80", b"\xff",
              b"\xf5\x80\x80\x80", b"\xf4\x90\x80\x80", b"\xf4\x8f\xbf\xbf", b"\x85", b"\x00"]
    rng = random.Random(14)
    lines = [b"".join(rng.choice(pieces) for _ in range(rng.randint(1, 25))) for _ in range(600)]
    data = b"".join(line + rng.choice([b"\n", b"\r", b"\r\n"]) for line in lines)
    (tmp_path / "in.bin").write_bytes(data)

    def jvm(name):
        return harness.run(name).split("\n")[:-1]
    assert jvm("in.bin") == [as_java_text(line + b"\n", len(line) + 1)[:-1].hex() for line in lines]
    for i in range(60):
        tail = b"".join(rng.choice(pieces) for _ in range(rng.randint(1, 4)))
        (tmp_path / f"{i}.bin").write_bytes(tail)
        assert jvm(f"{i}.bin") == [as_java_text(tail, len(tail)).hex()], tail
