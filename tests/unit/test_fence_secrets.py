"""Issue 32, finding 17: the fence command's argv (a BMC password on it, for one) is never logged
nor put into an error; the program's name and the node are."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator

import pytest
import structlog
from structlog.testing import capture_logs

from supervisor.adapters.fence import CommandFencer
from supervisor.ports import TransientError

SECRET = "bmc-password-hunter2"


@pytest.fixture(autouse=True)
def every_level() -> Iterator[None]:
    """Info lines reach capture_logs whatever level an earlier test configured (a CLI test leaves
    warning: the success line was filtered out, and the test failed in full runs only)."""
    saved = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG))
    yield
    structlog.configure(**saved)


def test_a_fence_that_succeeds_logs_the_program_and_the_node_not_the_argv() -> None:
    fencer = CommandFencer([sys.executable, "-c", "pass", "--password", SECRET, "{node}"])
    with capture_logs() as logs:
        fencer.fence("n7")
    assert SECRET not in repr(logs)
    assert logs[-1]["node"] == "n7" and logs[-1]["program"] == sys.executable.rsplit("/", 1)[-1]


@pytest.mark.parametrize("body", ["import sys; sys.exit(3)", "import time; time.sleep(5)"])
def test_a_fence_that_fails_or_hangs_names_no_secret_in_its_error(body: str) -> None:
    fencer = CommandFencer([sys.executable, "-c", body, "--password", SECRET, "{node}"], timeout=0.5)
    with capture_logs() as logs, pytest.raises(TransientError) as caught:
        fencer.fence("n7")
    assert SECRET not in str(caught.value) and SECRET not in repr(logs)
