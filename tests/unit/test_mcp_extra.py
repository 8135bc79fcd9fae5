"""The MCP adapter is an optional extra: without the SDK, one clear line naming it."""

from __future__ import annotations

import subprocess
import sys

from canon.integrations.mcp import RUN_ID_KEY, TOOL_CALL_ID_KEY, call_meta

#: Makes ``mcp`` (and its types) unimportable, as on an install without the extra.
_WITHOUT_SDK = """
import sys
class _NoSdk:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("mcp", "mcp_types"):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None
sys.meta_path.insert(0, _NoSdk())
"""


def run_python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_without_the_sdk_each_module_is_one_import_error_naming_the_extra() -> None:
    """``import canon.integrations.mcp`` (or ``.mcp_proxy``) names ``canon-store[mcp]``."""
    for module in ("canon.integrations.mcp", "canon.mcp_proxy.answers"):
        done = run_python(
            _WITHOUT_SDK
            + f"try:\n    import {module}\nexcept ImportError as e:\n    print(e)\n"
            + "else:\n    print('imported')"
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert "pip install 'canon-store[mcp]'" in done.stdout


def test_without_the_sdk_the_proxy_command_says_so_in_one_line() -> None:
    """``canon mcp-proxy`` exits 2 with the extra's name, no traceback."""
    done = run_python(
        _WITHOUT_SDK + "import sys, canon.cli\nsys.exit(canon.cli.main(sys.argv[1:]))",
        "mcp-proxy",
        "--redis-url=redis://127.0.0.1:1/0",
        "--",
        "true",
    )
    assert done.returncode == 2
    assert done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith("canon: error:") and "canon-store[mcp]" in line


def test_call_meta_names_only_the_ids_given() -> None:
    """The ``_meta`` convention: canon's two keys, each only when the host has the id."""
    assert call_meta() == {}
    assert call_meta(tool_call_id="toolu_01") == {TOOL_CALL_ID_KEY: "toolu_01"}
    assert call_meta(tool_call_id="c", run_id="r") == {
        TOOL_CALL_ID_KEY: "c",
        RUN_ID_KEY: "r",
    }
    assert (TOOL_CALL_ID_KEY, RUN_ID_KEY) == ("io.canon/tool_call_id", "io.canon/run_id")
