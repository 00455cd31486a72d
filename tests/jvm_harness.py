"""The JVM differential tests' shared steps (test_properties, test_config, test_java_datetime,
test_java_text): skip without a JDK, compile a small Java class in the test's tmp_path, run it
on files there, and the one-text-per-line input format the harnesses read."""
import shutil
import subprocess

import pytest

needs_jdk = pytest.mark.skipif(not (shutil.which("javac") and shutil.which("java")),
                               reason="needs a JDK")


class JavaHarness:
    """`source`, a Java class named `name`, compiled in `cwd`; run() gives its stdout."""

    def __init__(self, cwd, name: str, source: str) -> None:
        self.cwd, self.name = cwd, name
        (cwd / f"{name}.java").write_text(source)
        subprocess.run(["javac", f"{name}.java"], cwd=cwd, check=True, timeout=120)

    def run(self, *args: str) -> str:
        return subprocess.run(["java", "-cp", ".", self.name, *args], cwd=self.cwd, check=True,
                              capture_output=True, text=True, timeout=300).stdout


def write_texts(path, texts) -> None:
    """One text per line, each character as its hex code (the harnesses read them back with
    Integer.parseInt(h, 16)), so any character survives the file."""
    path.write_text("\n".join(",".join("%x" % ord(c) for c in t) for t in texts) + "\n")
