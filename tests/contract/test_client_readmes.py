"""The code in the TypeScript and Go clients' READMEs compiles against the clients as they are.

Each README's blocks are read in page order, as a reader reads them (a later block may use what
an earlier one made): the TypeScript ones become one module that imports ``jobq-client`` as an
application would (the built package, linked into ``node_modules``) and is type-checked with
``tsc --noEmit``; the Go ones become functions of one ``main`` package, a block that goes on
from the one before (it uses what that one declared) joined to it, checked with ``go vet``. What
the examples leave to the reader (sending the mail, importing rows) is declared, and nothing
else. The behaviour behind the calls is the contract suite's and the clients' own tests' to
check; this keeps the pages from naming an option, a method or a type that is gone.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.contract.drivers import (
    GO_DIR,
    TYPESCRIPT_DIR,
    build_typescript,
    go_binary,
    node_binary,
    unavailable,
)

# The reader's own functions the examples call, with the shapes the examples call them with.
TYPESCRIPT_READER = """\
declare function sendMail(to: string, options: { signal: AbortSignal }): Promise<void>;
declare function importRows(from: number, to: number, signal: AbortSignal): Promise<void>;
"""
GO_READER = """\
func sendWelcome(ctx context.Context, user int) error { return nil }
func importChunk(ctx context.Context, n int) error { return nil }
"""
GO_IMPORTS = ("context", "log", "os", "os/signal", "syscall", "time")
# A Go block that begins with one of these goes on from the block before it.
GO_CONTINUES = re.compile(r"^(worker|client|ctx)\.")


def blocks(readme: Path, lang: str) -> list[str]:
    text = readme.read_text(encoding="utf-8")
    return [m.group(1) for m in re.finditer(rf"^```{lang}\n(.*?)^```", text, re.S | re.M)]


def test_the_typescript_readme_compiles(tmp_path: Path) -> None:
    build_typescript()
    found = blocks(TYPESCRIPT_DIR / "README.md", "ts")
    assert len(found) >= 3
    modules = tmp_path / "node_modules"
    modules.mkdir()
    (modules / "jobq-client").symlink_to(TYPESCRIPT_DIR, target_is_directory=True)
    (modules / "@types").symlink_to(TYPESCRIPT_DIR / "node_modules" / "@types")
    (tmp_path / "package.json").write_text('{"type": "module"}', encoding="utf-8")
    (tmp_path / "example.mts").write_text(
        TYPESCRIPT_READER + "\n".join(found) + "\nexport {};\n", encoding="utf-8"
    )
    # An application's usual strict settings, not the client's own stricter ones (unused
    # locals, exact optional types) that a reader's project need not share.
    options = {
        "strict": True,
        "target": "ES2022",
        "module": "NodeNext",
        "moduleResolution": "NodeNext",
        "noEmit": True,
        "types": ["node"],
    }
    (tmp_path / "tsconfig.json").write_text(
        json.dumps({"compilerOptions": options, "files": ["example.mts"]}), encoding="utf-8"
    )
    tsc = TYPESCRIPT_DIR / "node_modules" / "typescript" / "bin" / "tsc"
    done = subprocess.run(
        [node_binary(), str(tsc), "-p", str(tmp_path / "tsconfig.json")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, f"tsc:\n{done.stdout}\n{done.stderr}"


def test_the_go_readme_compiles(tmp_path: Path) -> None:
    go = go_binary()
    if go is None:
        unavailable("no go command: apt-get install golang-go (Go 1.19 or newer)")
        return
    module = (GO_DIR / "go.mod").read_text(encoding="utf-8").split()[1]
    found = [b for b in blocks(GO_DIR / "README.md", "go") if not b.startswith("import ")]
    assert len(found) >= 3
    functions: list[str] = []
    for block in found:
        if GO_CONTINUES.match(block) and functions:
            functions[-1] += block
        else:
            functions.append(block)
    bodies = "".join(
        f"func example{n}() {{\n{body}}}\n\n" for n, body in enumerate(functions, start=1)
    )
    imports = "".join(f'\t"{name}"\n' for name in GO_IMPORTS)
    uses = "var _ = log.Fatal\nvar _ = os.Getenv\nvar _ = signal.NotifyContext\n"
    uses += "var _ = syscall.SIGTERM\nvar _ = time.Minute\n"
    (tmp_path / "go.mod").write_text(
        f"module readmeexample\n\ngo 1.19\n\nrequire {module} v0.0.0\n\n"
        f"replace {module} => {GO_DIR}\n",
        encoding="utf-8",
    )
    (tmp_path / "main.go").write_text(
        f'package main\n\nimport (\n{imports}\n\tjobq "{module}"\n)\n\n{uses}\n{GO_READER}\n'
        f"{bodies}func main() {{}}\n",
        encoding="utf-8",
    )
    done = subprocess.run(
        [go, "vet", "."],
        cwd=tmp_path,
        env={**os.environ, "GOFLAGS": "-mod=mod", "GOPROXY": "off"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, (
        f"go vet:\n{done.stdout}\n{done.stderr}\n{(tmp_path / 'main.go').read_text()}"
    )


@pytest.mark.parametrize("readme", [TYPESCRIPT_DIR / "README.md", GO_DIR / "README.md"])
def test_the_readme_has_code_to_check(readme: Path) -> None:
    assert blocks(readme, "ts" if "typescript" in str(readme) else "go")
