"""tc's commands: each reads the API and prints for a person, or JSON with --json."""

import argparse
import getpass
import json
import sys
from pathlib import Path, PurePosixPath

from . import config, data
from .api import Client
from .documents import dumps, line_text, load_document, submission_of, with_flags, zipped_folder
from .errors import BadInput, CliError
from .follow import Follower, exit_code_of

LIST_COLUMNS = (("id", "ID"), ("name", "NAME"), ("status", "STATUS"), ("engine", "ENGINE"), ("spec", "SPEC"),
                ("node_count", "NODES"), ("exit_code", "EXIT"), ("created_at", "CREATED"))
WATCHDOG_ACTIONS = ("warn", "stop")


def watchdog_action(text: str) -> str:
    """--watchdog-action: what the watchdog does once it suspects the job hangs."""
    if text not in WATCHDOG_ACTIONS:
        raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(WATCHDOG_ACTIONS)}")
    return text


def seconds_or_off(text: str) -> int | str:
    """--rank-exit-grace: whole seconds (0: fail at once), or off (never fail for a rank's end)."""
    if text == "off":
        return text
    if not (text.isascii() and text.isdigit()):
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of seconds, nor off")
    return int(text)


# The submission flags, each the API field of the same meaning, with how its value is read (int: a whole number).
SUBMIT_FLAGS = (("--name", "name", str), ("--description", "description", str), ("--engine", "engine", str),
                ("--engine-version", "engine_version", str), ("--code-dir", "code_dir", str),
                ("--boot-file", "boot_file", str), ("--spec", "spec", str), ("--pool", "pool", str),
                ("--nodes", "node_count", int), ("--data-url", "data_url", str), ("--train-url", "train_url", str),
                ("--extra-args", "extra_args", str), ("--auto-stop-hours", "auto_stop_hours", int),
                ("--watchdog-seconds", "watchdog_seconds", int), ("--watchdog-action", "watchdog_action", watchdog_action),
                ("--rank-exit-grace", "rank_exit_grace_seconds", seconds_or_off),
                ("--checkpoint-grace", "checkpoint_grace_seconds", int),
                ("--debug-hold-minutes", "debug_hold_minutes", int))


def client_of(args) -> Client:
    return Client(config.load(args.url, args.token))


def job_id(client: Client, given: str) -> int:
    """A job named by its id, or by its name (the newest job of that name the user may see)."""
    if given.isdigit():
        return int(given)
    found = [job for job in client.get("training-jobs", name=given, limit=100)["results"] if job["name"] == given]
    if not found:
        raise BadInput(f"no job is named {given!r} (give its id, or its exact name)")
    return found[0]["id"]


def report(data, as_json: bool, text: str) -> int:
    print(dumps(data) if as_json else text)
    return 0


def print_job(job: dict, as_json: bool) -> None:
    if as_json:
        print(dumps(job))
        return
    engine = " ".join(part for part in (job.get("engine"), job.get("engine_version")) if part)
    rows = [("job", f"{job['id']} {job['name']}"), ("status", job["status"]), ("message", job.get("status_message")),
            ("engine", engine), ("code", f"{job.get('code_dir')} / {job.get('boot_file')}"),
            ("spec", f"{job.get('spec')} x {job.get('node_count')} node(s)"), ("exit code", job.get("exit_code")),
            ("waiting", job.get("waiting_reason")), ("command", job.get("command"))]
    if job.get("held_until"):
        rows.append(("held until", f"{job['held_until']}: its containers and nodes are kept for a look inside "
                                   f"(tc shell {job['id']})"))
    slurm = job.get("slurm") or {}
    if slurm.get("job_id") is not None:
        facts = [f"job {slurm['job_id']}", slurm.get("state") or "", slurm.get("reason") or ""]
        accounting = slurm.get("accounting") or {}
        facts += [f"{name} {accounting[name]}" for name in ("account", "qos") if accounting.get(name)]
        rows.append(("slurm", ", ".join(fact for fact in facts if fact)))
    forecast = job.get("start_forecast") or {}
    if forecast.get("waiting"):
        rows.append(("may start", forecast.get("estimate")))
        rows.extend(("sooner", alternative["words"]) for alternative in forecast.get("alternatives") or [])
    checkpoints = job.get("checkpoints") or []
    if checkpoints:
        newest = checkpoints[0]
        rows.append(("checkpoint", f"step {newest['step']} ({newest['path']}, attempt {newest['attempt']}), "
                                   f"{len(checkpoints)} in all"))
    for attempt in job.get("attempts") or []:
        rows.append((f"attempt {attempt['number']}", f"lost {attempt['lost_seconds']:.0f} s, "
                                                      f"{attempt['lost_node_hours']:.2f} node-h"))
    for label, value in rows:
        if value not in (None, ""):
            print(f"{label:>10}: {value}")


def cmd_login(args) -> int:
    url = config.normalised_url(args.url or input("Console URL: "))
    token = args.token or (getpass.getpass("API token: ") if sys.stdin.isatty() else sys.stdin.readline()).strip()
    if not token:
        raise BadInput("give the API token made on the console's API tokens page")
    settings = config.Settings(url, token)
    Client(settings).get("training-jobs", limit=1)
    path = config.save(settings)
    print(f"Signed in to {url}; the token is kept in {path} (readable by you only).")
    return 0


def cmd_submit(args) -> int:
    document = load_document(args.file) if args.file else {}
    flags = {field: getattr(args, field) for _flag, field, _type in SUBMIT_FLAGS}
    body = with_flags(document, flags, args.param, args.env)
    client = client_of(args)
    job = client.submit(body)
    return submitted(client, job, args)


def submitted(client: Client, job: dict, args) -> int:
    if args.json and not args.follow:
        print(dumps(job))
    else:
        print(f"Submitted job {job['id']} ({job['name']}): {job['status']}", file=sys.stderr if args.follow else sys.stdout)
    if args.follow:
        return follow(client, job["id"], {}, args.json)
    return 0


def cmd_ls(args) -> int:
    client = client_of(args)
    query = {"status": args.status or None, "owner": args.owner, "spec": args.spec, "pool": args.pool,
             "name": args.name, "created_after": args.created_after, "created_before": args.created_before,
             "ordering": args.ordering}
    jobs = list(client.pages("training-jobs", query, None if args.all else args.limit))
    if args.json:
        print(dumps(jobs))
        return 0
    table = [[title for _key, title in LIST_COLUMNS]]
    table += [["" if job.get(key) is None else str(job[key])[:19] for key, _title in LIST_COLUMNS] for job in jobs]
    widths = [max(len(row[column]) for row in table) for column in range(len(LIST_COLUMNS))]
    for row in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    return 0


def cmd_show(args) -> int:
    client = client_of(args)
    job = client.get(f"training-jobs/{job_id(client, args.job)}")
    if job.get("status") == "Pending":
        # When it may start and what would start it sooner (the console's start forecast).
        job["start_forecast"] = client.get(f"training-jobs/{job['id']}/start-forecast")
    print_job(job, args.json)
    return 0


def show_line(as_json: bool):
    def show(line: dict) -> None:
        print(json.dumps(line, ensure_ascii=False) if as_json else line_text(line), flush=True)
    return show


def follow(client: Client, job: int, query: dict, as_json: bool, last_id: str | None = None) -> int:
    ended = Follower(client, job, query, show_line(as_json), last_id=last_id).run()
    code = exit_code_of(ended)
    print(f"tc: job {job} {ended['status']}" + (f" (exit code {ended['exit_code']})" if ended.get("exit_code") is not None
                                                  else ""), file=sys.stderr)
    return code


def cmd_logs(args) -> int:
    client = client_of(args)
    job = job_id(client, args.job)
    query = {"worker": args.worker, "rank": args.rank}
    if args.follow:
        return follow(client, job, query, args.json, last_id=str(args.after) if args.after else None)
    show, after = show_line(args.json), args.after or 0
    while True:
        page = client.get(f"training-jobs/{job}/log/lines", after=after, **query)
        for line in page["lines"]:
            show(line)
        after = page["next"]
        if not page["more"]:
            return 0


def cmd_stop(args) -> int:
    client = client_of(args)
    job = client.post(f"training-jobs/{job_id(client, args.job)}/stop")
    return report(job, args.json, f"Job {job['id']} ({job['name']}): {job['status']}")


def cmd_shell(args) -> int:
    from .shell import run_shell

    client = client_of(args)
    return run_shell(client, job_id(client, args.job), args.worker)


def cmd_compare(args) -> int:
    from .compare import run_compare

    client = client_of(args)
    return run_compare(client, [job_id(client, given) for given in args.jobs], args.every_rank, args.json)


def writable_fields(client: Client) -> set[str] | None:
    try:
        schema = client.get("/api/v1/schema", format="json")
        return set(schema["components"]["schemas"]["TrainingJobRequest"]["properties"])
    except (CliError, KeyError, TypeError):
        return None


def cmd_rebuild(args) -> int:
    client = client_of(args)
    detail = client.get(f"training-jobs/{job_id(client, args.job)}")
    fields = writable_fields(client)
    body = submission_of(detail, fields)
    if args.name:
        body["name"] = args.name
    # Start from the old job's newest checkpoint (MA_RESUME_FROM) when asked, else from scratch: the copy does
    # not carry over what the old job resumed from.
    body.pop("resume_from_job", None)
    # The copy records where it came from (the console's family of a job), when the schema knows the field.
    if "rebuilt_from" in body or "rebuilt_from" in (fields or ()):
        body["rebuilt_from"] = detail["id"]
    if args.resume:
        body["resume_from_job"] = detail["id"]
    return submitted(client, client.submit(body), args)


def cmd_code_push(args) -> int:
    folder = Path(args.dir).expanduser()
    name = args.name or folder.resolve().name
    fields = {"name": name, **({"sharing": args.sharing} if args.sharing else {}),
              **({"group": args.group} if args.group else {})}
    client = client_of(args)
    with zipped_folder(folder, name) as archive:
        code_dir = client.upload("code-dirs", fields, "archive", f"{name}.zip", archive)
    return report(code_dir, args.json, f"Uploaded code directory {code_dir['name']} (id {code_dir['id']}): "
                  f"{code_dir['file_count']} file(s), {code_dir['size_bytes']} bytes, {code_dir['sharing']}")


def cmd_nccl(args) -> int:
    client = client_of(args)
    report = client.get(f"training-jobs/{job_id(client, args.job)}/nccl")
    if args.json:
        print(dumps(report))
        return 0
    expected = report["expected"]
    print(f"job {report['status']}: {report['nccl_lines']} NCCL line(s) of {report['log_lines']}; expected "
          f"{expected['ranks']} rank(s) on {expected['nodes']} node(s) over {expected['network']}")
    if not report["seen"]:
        print("NCCL printed nothing (set NCCL_DEBUG=INFO to see what it does).")
    summary = report.get("summary") or {}
    for key in ("version", "net", "transports", "process_count"):
        if summary.get(key) not in (None, "", [], {}):
            print(f"{key:>14}: {summary[key]}")
    for finding in report["diagnosis"]:
        print(f"[{finding.get('severity')}] {finding.get('message')}")
    return 0


def safe_destination(root: Path, path: str) -> Path:
    relative = PurePosixPath(path)
    if relative.is_absolute() or ".." in relative.parts:
        raise CliError(f"the console named an output outside its folder: {path!r}")
    return root.joinpath(*relative.parts)


def cmd_outputs(args) -> int:
    client = client_of(args)
    outputs = client.get(f"training-jobs/{job_id(client, args.job)}/outputs")
    if args.get:
        root = Path(args.get)
        for item in outputs["files"]:
            if item["kept"] and item["url"]:
                target = safe_destination(root, item["path"])
                target.parent.mkdir(parents=True, exist_ok=True)
                with open(target, "wb") as file:
                    client.download(item["url"], file)
    if args.json:
        print(dumps(outputs))
        return 0
    summary = outputs.get("summary") or {}
    if summary.get("message"):
        print(summary["message"])
    for item in outputs["files"]:
        print(f"{item['size']:>12}  {item['path']}" + ("" if item["kept"] else "  (not kept: over the limit)"))
    if args.get:
        print(f"Kept files saved under {args.get}", file=sys.stderr)
    return 0


def cmd_data_ls(args) -> int:
    return data.cmd_ls(client_of(args), args.object_url or "", args.json)


def cmd_data_push(args) -> int:
    return data.cmd_push(client_of(args), args.dir, args.object_url)


def cmd_data_get(args) -> int:
    return data.cmd_get(client_of(args), args.object_url, args.dir)
