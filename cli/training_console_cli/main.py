"""tc's command line: the parser, and main(), which turns every failure into one line and an exit code."""

import argparse
import sys

from . import __version__, commands
from .errors import EXIT_BAD_INPUT, EXIT_FAILED, CliError

STATES = ["Pending", "Creating", "Running", "Completed", "Failed", "Terminating", "Terminated", "Abnormal"]


class Parser(argparse.ArgumentParser):
    def error(self, message: str):
        # One line, like every other error of tc's (argparse's own prints the whole usage first).
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def non_negative(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number")
    return int(text)


def parser() -> argparse.ArgumentParser:
    root = Parser(prog="tc", description="The training console from a shell. The console's URL and token come "
                  "from --url/--token, TC_URL/TC_TOKEN, or the file `tc login` writes.")
    root.add_argument("--version", action="version", version=f"tc {__version__}")
    root.add_argument("--url", help="the console's URL, e.g. http://localhost:8000")
    root.add_argument("--token", help="an API token (made on the console's API tokens page)")
    sub = root.add_subparsers(dest="command", required=True, parser_class=Parser)

    def command(name: str, handler, help_text: str, *, reads: bool = True):
        found = sub.add_parser(name, help=help_text, description=help_text)
        found.set_defaults(handler=handler)
        if reads:
            found.add_argument("--json", action="store_true", help="print the API's JSON")
        return found

    login = command("login", commands.cmd_login, "keep the console's URL and a token for the next commands",
                    reads=False)
    login.add_argument("--url", default=argparse.SUPPRESS, help="the console's URL")
    login.add_argument("--token", default=argparse.SUPPRESS, help="the token (else asked for, or read from stdin)")

    for name, handler, text in (("submit", commands.cmd_submit, "submit a job from a YAML/JSON document and flags"),
                                ("rebuild", commands.cmd_rebuild, "submit a copy of a job")):
        found = command(name, handler, text)
        if name == "submit":
            found.add_argument("file", nargs="?", help="a YAML or JSON document: the API's submission body (- for stdin)")
            for flag, field, kind in commands.SUBMIT_FLAGS:
                found.add_argument(flag, dest=field, type=non_negative if kind is int else kind,
                                   help=f"the job's {field}")
            found.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                               help="a hyperparameter (repeatable)")
            found.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                               help="an environment variable (repeatable)")
        else:
            found.add_argument("job", help="the job's id or name")
            found.add_argument("--name", help="a name for the copy")
            found.add_argument("--resume", action="store_true",
                               help="start from the job's newest checkpoint (MA_RESUME_FROM)")
        found.add_argument("--follow", action="store_true",
                           help="then follow its log; the exit code is the job's")

    ls = command("ls", commands.cmd_ls, "list jobs, newest first")
    ls.add_argument("--status", action="append", choices=STATES, help="only jobs in this state (repeatable)")
    for flag in ("--owner", "--spec", "--pool", "--name"):
        ls.add_argument(flag, help=f"only jobs with this {flag[2:]}" + (" (part of it)" if flag == "--name" else ""))
    ls.add_argument("--created-after", help="only jobs created at or after this ISO 8601 time")
    ls.add_argument("--created-before", help="only jobs created before this ISO 8601 time")
    ls.add_argument("--ordering", help="e.g. -created_at, name, status")
    ls.add_argument("--limit", type=non_negative, default=50, help="at most this many (50)")
    ls.add_argument("--all", action="store_true", help="every matching job")

    for name, handler, text in (("show", commands.cmd_show, "show a job"),
                                ("stop", commands.cmd_stop, "stop a job"),
                                ("nccl", commands.cmd_nccl, "what NCCL did in a job")):
        command(name, handler, text).add_argument("job", help="the job's id or name")

    shell = command("shell", commands.cmd_shell, "a terminal in a worker's container of a running job (as the "
                    "job's user); exit the shell to end it", reads=False)
    shell.add_argument("job", help="the job's id or name")
    shell.add_argument("--worker", type=non_negative, default=0, help="the worker's index (0)")

    compare = command("compare", commands.cmd_compare, "2 to 10 jobs side by side: what differs, final metrics, "
                      "durations")
    compare.add_argument("jobs", nargs="+", metavar="job", help="a job's id or name")
    compare.add_argument("--every-rank", action="store_true", help="with --json: every rank's series, not rank 0's")

    logs = command("logs", commands.cmd_logs, "print a job's log; --follow until it ends, exiting with its code")
    logs.add_argument("job", help="the job's id or name")
    logs.add_argument("--follow", "-f", action="store_true", help="follow live until the job ends")
    logs.add_argument("--worker", type=non_negative, help="only this worker's lines")
    logs.add_argument("--rank", type=non_negative, help="only this rank's lines")
    logs.add_argument("--after", type=non_negative, help="start after this line number (a follower's last one)")

    outputs = command("outputs", commands.cmd_outputs, "list a job's outputs; --get DIR downloads the kept ones")
    outputs.add_argument("job", help="the job's id or name")
    outputs.add_argument("--get", metavar="DIR", help="save the kept files under DIR")

    code = sub.add_parser("code", help="code directories").add_subparsers(dest="code_command", required=True,
                                                                           parser_class=Parser)
    push = code.add_parser("push", help="upload a folder as a code directory")
    push.set_defaults(handler=commands.cmd_code_push)
    push.add_argument("dir", help="the folder")
    push.add_argument("--name", help="the code directory's name (the folder's by default)")
    push.add_argument("--sharing", choices=["private", "everyone", "group"], help="who else may see it")
    push.add_argument("--group", help="the group to share it with")
    push.add_argument("--json", action="store_true", help="print the API's JSON")

    stored = sub.add_parser("data", help="your bucket in the console's object stores (s3://, obs://)").add_subparsers(
        dest="data_command", required=True, parser_class=Parser)
    listing = stored.add_parser("ls", help="your buckets, or what a folder holds")
    listing.set_defaults(handler=commands.cmd_data_ls)
    listing.add_argument("object_url", metavar="URL", nargs="?", help="s3://bucket/folder/ (none: your buckets)")
    listing.add_argument("--json", action="store_true", help="print the API's JSON")
    data_push = stored.add_parser("push", help="upload a folder's files under an s3:// or obs:// folder")
    data_push.set_defaults(handler=commands.cmd_data_push)
    data_push.add_argument("dir", help="the local folder")
    data_push.add_argument("object_url", metavar="URL", help="s3://bucket/folder/")
    data_get = stored.add_parser("get", help="download an object, or a folder's objects (a URL ending in /)")
    data_get.set_defaults(handler=commands.cmd_data_get)
    data_get.add_argument("object_url", metavar="URL", help="s3://bucket/folder/ or s3://bucket/key")
    data_get.add_argument("dir", help="the local folder to save into")
    return root


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.handler(args)
    except CliError as error:
        print(f"tc: error: {error}", file=sys.stderr)
        return error.code
    except KeyboardInterrupt:
        print("tc: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as error:  # noqa: BLE001 - one line, never a traceback
        print(f"tc: error: {type(error).__name__}: {error}", file=sys.stderr)
        return EXIT_FAILED
