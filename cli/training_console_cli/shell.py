"""tc shell: a terminal in a worker's container of a running job (or of a failed job held for a look inside),
through the console's shell routes: what is typed goes to the console as it comes, the terminal's output is
read from its event stream (resumed with Last-Event-ID after a lost connection), and tc ends when the shell
does. From a pipe (stdin not a terminal) the text is sent as typed and its end as Ctrl-D, so a script can run
a few commands."""

import codecs
import http.client
import json
import os
import select
import shutil
import signal
import sys
import termios
import threading
import time
import tty
from typing import Any

from .api import Client, Unreachable
from .errors import CliError
from .follow import READ_TIMEOUT_SECONDS, events

END_OF_INPUT = "\x04"
SEND_ATTEMPTS = 60
RECONNECT_GIVE_UP_SECONDS = 60


class OutputReader(threading.Thread):
    """Writes the terminal's output to stdout until its end event; `reason` is why it ended."""

    def __init__(self, client: Client, output_url: str):
        super().__init__(daemon=True)
        self.client, self.output_url = client, output_url
        self.last_id: str | None = None
        self.reason: str | None = None
        self.error: str | None = None

    def run(self) -> None:
        lost_since: float | None = None
        while self.reason is None:
            try:
                self.read_once()
                lost_since = None
            except (OSError, http.client.HTTPException, Unreachable) as error:
                lost_since = lost_since or time.monotonic()
                if time.monotonic() - lost_since > RECONNECT_GIVE_UP_SECONDS:
                    self.error = f"lost the terminal's output and could not reconnect: {error}"
                    return
                time.sleep(1)
            except CliError as error:
                self.error = str(error)
                return

    def read_once(self) -> None:
        headers = {"Accept": "text/event-stream"}
        if self.last_id is not None:
            headers["Last-Event-ID"] = self.last_id
        with self.client.open("GET", self.output_url, headers=headers, timeout=READ_TIMEOUT_SECONDS) as response:
            for event in events(iter(response.readline, b"")):
                data: Any = json.loads(event.get("data") or "null")
                if event.get("event") == "end":
                    self.reason = str(data.get("reason", "")) if isinstance(data, dict) else ""
                    return
                if isinstance(data, dict):
                    sys.stdout.write(str(data.get("text", "")))
                    sys.stdout.flush()
                self.last_id = event.get("id", self.last_id)
        raise OSError("the stream closed before the terminal's end")


def send(client: Client, input_url: str, body: dict) -> None:
    for _attempt in range(SEND_ATTEMPTS):
        try:
            client.post(input_url, body)
            return
        except CliError as error:
            # 429: the shell has not taken the last keys yet.
            if "try again" not in str(error):
                raise
            time.sleep(0.5)
    raise CliError(f"the terminal took nothing for {SEND_ATTEMPTS // 2} s: what was typed since was not sent")


def run_shell(client: Client, job_id: int, worker: int) -> int:
    size = shutil.get_terminal_size((80, 24))
    opened = client.post(f"training-jobs/{job_id}/shells", {"worker": worker, "columns": max(size.columns, 10),
                                                            "rows": max(size.lines, 4)})
    reader = OutputReader(client, opened["output_url"])
    reader.start()
    interactive = sys.stdin.isatty()
    saved = termios.tcgetattr(sys.stdin.fileno()) if interactive else None
    if interactive:
        def resized(_signum, _frame) -> None:
            now = shutil.get_terminal_size((80, 24))
            threading.Thread(target=send, args=(client, opened["input_url"],
                                                {"columns": now.columns, "rows": now.lines}), daemon=True).start()

        signal.signal(signal.SIGWINCH, resized)
        tty.setraw(sys.stdin.fileno())
    try:
        pump_input(client, opened["input_url"], reader)
        reader.join()
    finally:
        if saved is not None:
            termios.tcsetattr(sys.stdin.fileno(), termios.TCSADRAIN, saved)
        if reader.reason is None:
            # Ended on this side (an error, Ctrl-\): the shell is not left open until it idles out.
            try:
                client.post(opened["input_url"], {"close": True})
            except CliError:
                pass
    if reader.error:
        raise CliError(reader.error)
    print(f"\r\ntc: the terminal closed: {reader.reason}", file=sys.stderr)
    return 0


def pump_input(client: Client, input_url: str, reader: OutputReader) -> None:
    """Send what is typed until the terminal ends (or, from a pipe, until its end, sent as Ctrl-D)."""
    descriptor = sys.stdin.fileno()
    # A character's bytes may come in two reads.
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    while reader.is_alive():
        ready, _, _ = select.select([descriptor], [], [], 0.5)
        if not ready:
            continue
        chunk = os.read(descriptor, 4096)
        if not chunk:
            send(client, input_url, {"text": decoder.decode(b"", final=True) + END_OF_INPUT})
            return
        text = decoder.decode(chunk)
        if text:
            send(client, input_url, {"text": text})
