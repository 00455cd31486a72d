"""properties.py: server.properties read exactly as java.util.Properties.load reads it. The
table's expected pairs were printed by Java 17's Properties.load(InputStream) for the same
bytes; the differential test compares random texts with the JVM when a JDK is installed."""
import random
import textwrap

import pytest

from jvm_harness import JavaHarness, needs_jdk
from kstore.errors import InvalidConfigError
from kstore.properties import load_properties, parse_properties

ERR = "malformed"
# bytes -> what java.util.Properties.load(InputStream) gave (ERR: IllegalArgumentException)
JAVA = [
    (b"# comment\n! also\n  a = 1\nb:2\nc 3\nd=x\\\n   y\ne=\\u0041\\tB\nk\\:x=v\nempty=\nlast\\\n",
     {"a": "1", "b": "2", "c": "3", "d": "xy", "e": "A\tB", "empty": "", "k:x": "v", "last": ""}),
    (b"a=1\x85b=2\n", {"a": "1\x85b=2"}),                   # NEL is data, not a line break
    (b"a=x\x0by\x0cz\x1cw\n", {"a": "x\x0by\x0cz\x1cw"}),    # so are VT, FF and FS
    (b"a=1\rb=2\r\nc=3\n", {"a": "1", "b": "2", "c": "3"}),
    (b"k = = v\n", {"k": "= v"}),                           # one separator only
    (b"k=:v\n", {"k": ":v"}),
    (b"k :v\n", {"k": "v"}),
    (b"k\\ x=1\n", {"k x": "1"}),
    (b"\\#notcomment=1\n", {"#notcomment": "1"}),
    (b"a=1\\\n# not a comment: continued\n", {"a": "1# not a comment: continued"}),
    (b"\\\n#x=1\n", {}),                 # a continued line that was only "\": then a comment
    (b"a=b\\\\\nc=d\n", {"a": "b\\", "c": "d"}),           # an escaped backslash ends the line
    (b"a=b\\\r\n   c\n", {"a": "bc"}),
    (b"   \n\t\x0c\nx\n", {"x": ""}),
    (b"a=\\ud83d\\ude00\n", {"a": "\U0001f600"}),           # a surrogate pair: one character
    (b"a=\xe9\n", {"a": "\xe9"}),                           # ISO-8859-1
    (b"a=\\q\\z\n", {"a": "qz"}),
    (b"a=1\na=2\n", {"a": "2"}),
    (b"a=\\u00", ERR),
    (b"a=\\u00g1\n", ERR),
    (b"ok=1\n\nbad=\\u+123\n", ERR),
    (b"#only\\\nx=1\n", {"x": "1"}),     # a comment line is never continued
    (b"key\\\n", {"key": ""}),
    (b"a:b=c\n", {"a": "b=c"}),
    (b"a\\=b=c\n", {"a=b": "c"}),
]


@pytest.mark.parametrize("data,expected", JAVA)
def test_what_java_reads(tmp_path, data, expected):
    path = tmp_path / "server.properties"
    path.write_bytes(data)
    if expected == ERR:
        with pytest.raises(InvalidConfigError, match="Malformed \\\\uxxxx encoding"):
            load_properties(str(path))
    else:
        assert load_properties(str(path)) == expected


def test_a_malformed_escape_names_the_file_and_line(tmp_path):
    path = tmp_path / "server.properties"
    path.write_bytes(b"# broker\nlog.dirs=/data\r\n\nnum.partitions=\\u12\n")
    with pytest.raises(InvalidConfigError) as ei:
        load_properties(str(path))
    assert str(ei.value) == (f"{path}, line 4: Malformed \\uxxxx encoding (java.util.Properties "
                             "refuses it): 'num.partitions=\\\\u12'")
    with pytest.raises(InvalidConfigError, match="server.properties, line 4"):
        from kstore import LogManager
        LogManager.from_properties(str(path))


_JAVA_DUMP = textwrap.dedent("""
    import java.io.*; import java.util.*;
    public class Dump {
      public static void main(String[] a) throws Exception {
        for (String path : a) {
          Properties p = new Properties();
          StringBuilder b = new StringBuilder();
          try (InputStream in = new FileInputStream(path)) {
            p.load(in);
            for (String k : new TreeSet<>(p.stringPropertyNames()))
              b.append(hex(k)).append('=').append(hex(p.getProperty(k))).append(';');
          } catch (IllegalArgumentException e) { b.append("ERR"); }
          System.out.println(b);
        }
      }
      static String hex(String s) {
        StringBuilder b = new StringBuilder();
        for (char c : s.toCharArray()) b.append(String.format("%04x", (int) c));
        return b.toString();
      }
    }
    """)


def _units(s):
    """s as Java's dump writes it: UTF-16 code units in hex."""
    return s.encode("utf-16-be", "surrogatepass").hex()


@needs_jdk
def test_random_texts_read_as_the_jvm_reads_them(tmp_path):
    """2000 random texts of the characters the rules turn on: kstore's pairs equal the JVM's."""
    dump = JavaHarness(tmp_path, "Dump", _JAVA_DUMP)
    pieces = [b"\\", b"=", b":", b" ", b"\t", b"\f", b"\n", b"\r", b"\r\n", b"#", b"!", b"u",
              b"0", b"a", b"k", b"\x85", b"\x0b", b"\x1c", b"\xe9", b"\\u00e9", b"\\u12", b"\\n",
              b"\\\n", b"\\\r\n", b"\\ud83d", b"\\uDE00", b"\\u+123", b"\\u0x12", b"\\\\", b"\\=",
              b"\\ "]
    rng = random.Random(14)
    paths = []
    for i in range(2000):
        p = tmp_path / f"{i}.properties"
        p.write_bytes(b"".join(rng.choice(pieces) for _ in range(rng.randint(1, 40))))
        paths.append(str(p))
    java = dump.run(*paths).splitlines()
    assert len(java) == len(paths)
    for path, want in zip(paths, java):
        try:
            props = load_properties(path)
        except InvalidConfigError:
            got = "ERR"
        else:
            got = "".join(f"{_units(k)}={_units(v)};"
                          for k, v in sorted(props.items(), key=lambda kv: _units(kv[0])))
        assert got == want, open(path, "rb").read()


def test_parse_properties_of_text():
    """parse_properties takes text already decoded (a meta.properties read by spark/deploy.py)."""
    assert parse_properties("cluster.id=CLU\ndirectory.id=D\u2028X\n") == {
        "cluster.id": "CLU", "directory.id": "D\u2028X"}            # U+2028 is data too
