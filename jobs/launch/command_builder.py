"""The background command of an MPI job, built in one place for the form preview and the launch.

Pure: it takes plain values and returns plain values, so the preview a user sees while typing
is, by construction, the command the launcher runs.

The shape is the reference platform's:

    mpirun -np ${OPENMPI_NP} -hostfile ${OPENMPI_HOST_FILE_PATH} -mca plm_rsh_args "-p ${SSHD_PORT}"
      -tune ${TUNE_ENV_FILE} ${OPENMPI_BIND_ARGS} ${OPENMPI_X_ARGS} ${OPENMPI_MCA_ARGS}
      ${OPENMPI_EXTRA_ARGS} python <boot file> <job parameters>

One deliberate difference: the reference writes the tune file as `NAME=value` lines, which Open MPI
4.1 silently ignores. We write `-x NAME` lines instead; mpirun then forwards each variable's value
from its own environment verbatim, which is the reference's intent (worker-0's variables reach
every rank) made to work.
"""

import re
import shlex
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import re2
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from jobs.launch.platform_env import ENV_NAME, JOB_DIR, user_variable_problem

if TYPE_CHECKING:
    from django_stubs_ext import StrPromise

HOSTFILE_PATH = "/home/ma-user/.mpi/hostfile"
TUNE_FILE_PATH = "/home/ma-user/.mpi/tune-env"

ENV_NAME_RE = ENV_NAME
PARAM_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}\Z")


class CommandError(ValueError):
    """A value the command cannot be built from; `field` names the input that is wrong."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field
        self.message = message


@dataclass(frozen=True)
class LaunchInputs:
    processes_per_node: int
    worker_hostnames: Sequence[str]
    sshd_port: int
    python: str
    code_dir_name: str
    boot_file: str
    parameters: Sequence[tuple[str, str]] = ()
    worker0_env: Mapping[str, str] = field(default_factory=dict)
    bind_args: str = "-bind-to none -map-by slot"
    x_args: str = ""
    mca_args: str = ""
    extra_args: str = ""
    tune_prefixes: Sequence[str] = ("MA_", "SHARED_", "S3_", "PATH", "VC_WORKER_", "SCC", "CRED")


@dataclass(frozen=True)
class LaunchCommand:
    template: str
    argv: list[str]
    expanded: str
    variables: dict[str, str]
    hostfile: str
    tune_file: str
    working_dir: str


def split_args(field_name: str, text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError as error:
        raise CommandError(field_name, _("cannot be split into arguments: %(error)s") % {"error": error}) from None


# ---- mpirun's options: a user's OPENMPI_EXTRA_ARGS, and the administrator's defaults ----
#
# A user's OPENMPI_EXTRA_ARGS is checked against an allow-list (validate_extra_args); anything not on it
# is refused with a message naming the option. Built in:
#   flags     --report-bindings, --display-map, --display-devel-map, --display-allocation,
#             --display-devel-allocation, -v / --verbose, --tag-output
#             (--timestamp-output is left out: it puts a date before the rank tags the log is read by)
#   -x NAME=value, -x NAME   any NAME that user_variable_problem does not refuse (MA_*, OMPI_*, HOME,
#             LD_PRELOAD, ...); the value is free (mpirun hands it to the ranks in its launch message,
#             never through a shell: measured, `$(...)`, spaces and quotes arrive verbatim), no line breaks
#   --mca NAME VALUE  NAME in BUILTIN_MCA_FAMILIES (component selection btl/pml/mtl/coll/osc, TCP
#             interfaces, btl_tcp_/btl_vader_/btl_openib_/pml_ob1_/pml_ucx_/coll_tuned_ tuning, a few
#             mpi_ booleans), with a value of that family's shape; never plm_*, orte_*, mca_base_*, nor a
#             name holding agent, prefix, file, dir, path, exec, launch, cmd
#   --bind-to POLICY[:if-supported]   --map-by POLICY[:PE=n,NOOVERSUBSCRIBE]   (no OVERSUBSCRIBE, no ppr, no SPAN)
# Every option is accepted with one dash or two (-report-bindings, --mca), as mpirun accepts them.
#
# The administrator extends the list in LauncherDefaults.extra_options_allowed, one option a line
# (blank lines and lines starting with # are skipped):
#   --display-topo                    a flag
#   --timeout [0-9]+                  an option and a regular expression (RE2) its value must fully match
#   --mca coll_hcoll_enable [01]      for --mca the expression matches "NAME VALUE"
# An option in NEVER_OPTIONS cannot be allowed, and what holds for everyone (check_mpirun_options) still
# holds: reserved MCA names and variable names stay refused, and every option value but -x's keeps to
# SAFE_VALUE_RE, since mpirun turns many options into MCA parameters.
#
# The administrator's own defaults (bind_args, x_args, mca_args) are not held to the users' list; they,
# and at launch every job's arguments again, go through check_mpirun_options: no option the platform
# sets or that replaces what runs, no reserved MCA or variable name, MCA values of SAFE_VALUE_RE only.

# (Every pattern here ends in \Z, not $: `$` also matches before a final line break.)
# What a value may hold. Open MPI passes the MCA parameters it was given (on its command line or as
# OMPI_MCA_* variables) on to every remote orted on that orted's ssh command line, wrapped in double
# quotes only when the value has a space, so the node's shell reads them: `--mca x "$(touch /tmp/f)"`
# ran `touch` on worker-1. None of these characters means anything to a POSIX shell.
SAFE_VALUE_RE = re.compile(r"^[A-Za-z0-9_.,:/=+@%^-]+\Z")
# Besides letters and digits (said in the messages).
SAFE_VALUE_CHARACTERS = "_ . , : / = + @ % ^ -"
OPTION_RE = re.compile(r"^--?([A-Za-z][A-Za-z0-9-]*)\Z")
MCA_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*\Z")
MCA_OPTIONS = frozenset({"mca", "gmca"})
EXPORT_OPTION = "x"

# Each completes "OPTION ..." in the page's language (read when a message is made).
_PLATFORM = gettext_lazy("is set by the platform and cannot be changed")
_RUNS = gettext_lazy("would replace what the platform runs on the nodes, or how it starts it")
_PLACES = gettext_lazy("would change how many processes run or where; the spec and the node count decide that")
# Options nobody gives, whatever the lists say.
NEVER_OPTIONS: "dict[str, StrPromise]" = {
    **dict.fromkeys(("np", "n", "c", "hostfile", "machinefile", "default-hostfile", "H", "host", "add-host",
                     "add-hostfile", "tune", "am"), _PLATFORM),
    **dict.fromkeys(("prefix", "noprefix", "launch-agent", "app", "wdir", "wd", "path", "preload-files",
                     "preload-binary", "s", "debugger", "debug", "tv", "xterm"), _RUNS),
    **dict.fromkeys(("rankfile", "rf", "npernode", "N", "npersocket", "pernode", "ppr", "oversubscribe"), _PLACES),
    # The console puts each rank's lines and end on its worker by the plan's placement (plan.rank_workers),
    # which models slot and node mapping over equal slots: what reorders ranks or spreads them otherwise
    # would have the log and the failure card name another worker than the one a rank ran on.
    **dict.fromkeys(("rank-by", "bynode", "byslot", "cpus-per-proc", "cpus-per-rank"), _PLACES),
    "allow-run-as-root": gettext_lazy("would let the job's processes run as root"),
}
# MCA parameters nobody sets: the platform's own, the launcher's component, and whatever names an agent,
# an installation prefix, a parameter file or a host file (plm_rsh_agent, orte_fork_agent, orte_launch_agent,
# mca_base_param_files, ...).
RESERVED_MCA_PARAMS = frozenset({"plm", "plm_rsh_args", "orte_tag_output", "orte_default_hostfile",
                                 "orte_default_dash_host", "rmaps_base_oversubscribe"})
RESERVED_MCA_WORDS = ("agent", "prefix", "param_file", "hostfile")
RESERVED_MCA_PREFIXES = ("mca_base_",)
# The rank mapper's parameters: the plan's placement is what the log and the card go by (see NEVER_OPTIONS).
PLACEMENT_MCA_PREFIXES = ("rmaps_",)

BUILTIN_FLAGS = ("report-bindings", "display-map", "display-devel-map", "display-allocation",
                 "display-devel-allocation", "v", "verbose", "tag-output")
_BIND_TO = r"(?i:(?:none|hwthread|core|l1cache|l2cache|l3cache|socket|numa|board)(?::if-supported)?)"
# No SPAN: it spreads ranks over the nodes otherwise than the plan's placement says (see NEVER_OPTIONS).
_MAP_MODIFIER = r"(?:pe=\d{1,3}|nooversubscribe)"
_MAP_BY = (r"(?i:(?:slot|node|core|socket|numa|board|hwthread|l1cache|l2cache|l3cache)"
           rf"(?::{_MAP_MODIFIER}(?:,{_MAP_MODIFIER})*)?)")
_COMPONENTS = r"\^?[a-z0-9_]+(?:,[a-z0-9_]+)*"
_INTERFACES = r"[A-Za-z0-9_.:/-]+(?:,[A-Za-z0-9_.:/-]+)*"
_TUNING = r"[A-Za-z0-9_.:+-]+(?:,[A-Za-z0-9_.:+-]+)*"
_BOOLEAN = r"(?i:-1|0|1|true|false|yes|no)"
# The MCA parameters a user may set: (name, value) expressions, both to match in full.
BUILTIN_MCA_FAMILIES: tuple[tuple[Any, Any], ...] = tuple(
    (re.compile(name), re.compile(value))
    for name, value in (
        (r"btl|pml|mtl|coll|osc", _COMPONENTS),
        (r"(?:btl|oob)_tcp_if_(?:include|exclude)", _INTERFACES),
        (r"(?:btl_tcp|btl_vader|btl_openib|pml_ob1|pml_ucx|coll_tuned)_[a-z0-9_]+", _TUNING),
        (r"mpi_(?:leave_pinned|leave_pinned_pipeline|warn_on_fork|yield_when_idle|abort_print_stack)", _BOOLEAN),
    )
)
# Words that keep a parameter out of the users' families: they name files, directories and programs
# (btl_openib_device_param_files, coll_tuned_dynamic_rules_filename, ...).
USER_MCA_FORBIDDEN_WORDS = ("file", "dir", "path", "exec", "launch", "cmd", "command", "agent", "prefix")
MAX_ALLOWED_REGEX = 500
ALLOWED_FIELD = "extra_options_allowed"


@dataclass(frozen=True)
class OptionRule:
    """How one allowed option is given: "flag" (no value), "value" (one word), "mca" (NAME VALUE) or
    "export" (-x NAME[=value]); a value must fully match one of `patterns` (for "mca": "NAME VALUE",
    besides the built-in families; for "export" the variable-name rules decide)."""

    kind: str
    patterns: tuple[Any, ...] = ()


BUILTIN_OPTIONS: dict[str, OptionRule] = {
    **{name: OptionRule("flag") for name in BUILTIN_FLAGS},
    "bind-to": OptionRule("value", (re.compile(_BIND_TO),)),
    "map-by": OptionRule("value", (re.compile(_MAP_BY),)),
    EXPORT_OPTION: OptionRule("export"),
    "mca": OptionRule("mca"),
}
_ARITY = {"flag": 0, "value": 1, "export": 1, "mca": 2}


def _spelled(key: str) -> str:
    return f"-{key}" if len(key) == 1 else f"--{key}"


def _compile_allowed_regex(number: int, regex: str) -> Any:
    if len(regex) > MAX_ALLOWED_REGEX:
        raise CommandError(ALLOWED_FIELD, _("line %(number)s: the regular expression is longer than %(max)s characters")
                           % {"number": number, "max": MAX_ALLOWED_REGEX})
    options = re2.Options()
    options.log_errors = False
    try:
        return re2.compile(regex, options)
    except re2.error as error:
        reason = error.args[0].decode(errors="replace") if error.args and isinstance(error.args[0], bytes) else error
        raise CommandError(
            ALLOWED_FIELD,
            _("line %(number)s: %(regex)s is not a regular expression RE2 can run (no back-references or lookaround): "
              "%(reason)s") % {"number": number, "regex": repr(regex), "reason": reason},
        ) from None


def allowed_options(extension: str = "") -> dict[str, OptionRule]:
    """The options users may give: the built-in ones plus the administrator's lines (see above).

    Raises CommandError on the `extra_options_allowed` field for a line that cannot be used.
    """
    _check_text(ALLOWED_FIELD, extension)
    options = dict(BUILTIN_OPTIONS)
    for number, raw in enumerate(extension.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(None, 1)
        word, regex = parts[0], (parts[1].strip() if len(parts) > 1 else "")
        matched = OPTION_RE.match(word)
        if matched is None:
            raise CommandError(ALLOWED_FIELD, _("line %(number)s: %(word)s is not an mpirun option; begin the line with "
                                                "the option, such as --report-bindings") % {"number": number, "word": repr(word)})
        key = matched.group(1)
        if key in NEVER_OPTIONS:
            raise CommandError(ALLOWED_FIELD, _("line %(number)s: %(word)s cannot be allowed: it %(reason)s")
                               % {"number": number, "word": word, "reason": NEVER_OPTIONS[key]})
        existing = options.get(key)
        if not regex:
            if existing is not None and existing.kind != "flag":
                raise CommandError(ALLOWED_FIELD, _("line %(number)s: %(word)s takes a value; give the regular expression "
                                                    "its value must match after it") % {"number": number, "word": word})
            options[key] = OptionRule("flag")
            continue
        if existing is not None and existing.kind == "flag":
            raise CommandError(ALLOWED_FIELD, _("line %(number)s: %(word)s is a flag here (it takes no value); give it alone")
                               % {"number": number, "word": word})
        pattern = _compile_allowed_regex(number, regex)
        if existing is not None:
            kind = existing.kind
        else:
            kind = "mca" if key in MCA_OPTIONS else "export" if key == EXPORT_OPTION else "value"
        options[key] = OptionRule(kind, (*(existing.patterns if existing else ()), pattern))
    return options


def _check_text(field_name: str, text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise CommandError(field_name, _("holds characters that are not text")) from None


def _option_key(field_name: str, word: str) -> str:
    if word == "--":
        raise CommandError(field_name, _("-- would end mpirun's options and make what follows the program; the program "
                                         "and its arguments come from the boot file and the hyperparameters"))
    matched = OPTION_RE.match(word)
    if matched is None:
        raise CommandError(field_name, _("%(word)s is not an mpirun option (nor the value of one): the program and its "
                                         "arguments come from the boot file and the hyperparameters") % {"word": repr(word)})
    return matched.group(1)


def _take(field_name: str, args: Sequence[str], position: int, count: int) -> list[str]:
    values = list(args[position + 1:position + 1 + count])
    if len(values) < count:
        word = args[position]
        if word.lstrip("-") == EXPORT_OPTION:
            message = _("%(option)s needs NAME=value or NAME")
        elif count == 1:
            message = _("%(option)s needs a value")
        else:
            message = _("%(option)s needs a parameter name and a value")
        raise CommandError(field_name, message % {"option": word})
    return values


def mca_param_problem(name: str) -> str | None:
    """Why nobody may set the MCA parameter `name` (the message completes "the MCA parameter NAME ..."), or None."""
    if not MCA_NAME_RE.match(name):
        return _("is not an MCA parameter name (lowercase letters, digits and '_')")
    if name in RESERVED_MCA_PARAMS:
        return _("is set by the platform or chooses its launcher, and cannot be changed")
    if name.startswith(PLACEMENT_MCA_PREFIXES):
        return _("would change how many processes run or where; the spec and the node count decide that, and cannot be set")
    if name.startswith(RESERVED_MCA_PREFIXES) or any(word in name for word in RESERVED_MCA_WORDS):
        return _("would change what the platform runs on the nodes or where it reads its settings, and cannot be set")
    return None


def _check_safe_value(field_name: str, option: str, value: str, mca_name: str | None = None) -> None:
    """`value` as `option` may take it (as the MCA parameter `mca_name`'s value, for --mca)."""
    if not SAFE_VALUE_RE.match(value):
        if mca_name is None:
            message = _("the value of %(option)s may hold only letters, digits and %(characters)s (mpirun passes it on "
                        "to the other nodes through a shell)")
        else:
            message = _("the value of the MCA parameter %(name)s may hold only letters, digits and %(characters)s "
                        "(mpirun passes it on to the other nodes through a shell)")
        raise CommandError(field_name, message % {"option": option, "name": mca_name, "characters": SAFE_VALUE_CHARACTERS})


def _check_mca(field_name: str, word: str, name: str, value: str) -> None:
    problem = mca_param_problem(name)
    if problem:
        raise CommandError(field_name, _("%(option)s %(name)s: the MCA parameter %(name)s %(problem)s")
                           % {"option": word, "name": name, "problem": problem})
    _check_safe_value(field_name, word, value, mca_name=name)


def _check_export(field_name: str, word: str, given: str) -> None:
    name, has_value, value = given.partition("=")
    problem = user_variable_problem(name, value if has_value else None)
    if problem:
        raise CommandError(field_name, f"{word} {name}: {problem}")
    if any(character in value for character in "\n\r\0"):
        raise CommandError(field_name, _("%(option)s %(name)s: the value cannot hold a line break or a NUL")
                           % {"option": word, "name": name})


def _check_placement(field_name: str, word: str, key: str, value: str) -> None:
    if key == "map-by":
        lowered = value.lower()
        if ("oversubscribe" in lowered.replace("nooversubscribe", "") or lowered.startswith("ppr")
                or "span" in lowered.split(":", 1)[-1].split(",")):
            raise CommandError(field_name, f"{word} {value}: {_PLACES!s}")


@dataclass(frozen=True)
class _GivenOption:
    """One option as given: the word (`--mca`), its key (`mca`) and the values that follow it."""

    word: str
    key: str
    values: list[str]


def _given_options(field_name: str, args: Sequence[str], arity: Callable[[str, int], int]) -> Iterator[_GivenOption]:
    """mpirun's option grammar, walked once for both policies: every word is an option or one of its values
    (`arity` says how many an option at a position takes), never a program; options nobody gives are
    refused on the way."""
    position = 0
    while position < len(args):
        word = args[position]
        key = _option_key(field_name, word)
        if key in NEVER_OPTIONS:
            raise CommandError(field_name, f"{word} {NEVER_OPTIONS[key]!s}")
        values = _take(field_name, args, position, arity(key, position))
        yield _GivenOption(word, key, values)
        position += 1 + len(values)


def _anyones_arity(args: Sequence[str]) -> Callable[[str, int], int]:
    """How many values each option of `args` takes, for options of any list (not the users' alone)."""

    def arity(key: str, position: int) -> int:
        if key in MCA_OPTIONS:
            return 2
        known = BUILTIN_OPTIONS.get(key)
        if known is not None:
            return _ARITY[known.kind]
        # What follows an option this code does not know, and is no option itself, is taken as its value.
        following = args[position + 1] if position + 1 < len(args) else None
        return 1 if following is not None and following != "--" and not OPTION_RE.match(following) else 0

    return arity


def check_mpirun_options(field_name: str, text: str) -> list[str]:
    """mpirun options as anyone's list may hold them, as arguments: the administrator's defaults, and a job's
    arguments again at launch (the users' allow-list is validate_extra_args, at submission).

    Refuses a word that is no option's value (it would replace the program), options nobody gives
    (NEVER_OPTIONS), reserved MCA parameters and variable names, a map-by that oversubscribes, and option
    values outside SAFE_VALUE_RE (but -x's, which never reach a shell).
    """
    _check_text(field_name, text)
    args = split_args(field_name, text)
    for option in _given_options(field_name, args, _anyones_arity(args)):
        if option.key in MCA_OPTIONS:
            _check_mca(field_name, option.word, *option.values)
        elif option.key == EXPORT_OPTION:
            _check_export(field_name, option.word, option.values[0])
        elif option.values:
            _check_safe_value(field_name, option.word, option.values[0])
            _check_placement(field_name, option.word, option.key, option.values[0])
    return args


@dataclass(frozen=True)
class McaSetting:
    """One MCA parameter as mpirun options give it: `--mca btl_tcp_if_include eth0` (`word` is the option as
    spelled: --mca, -mca, --gmca)."""

    word: str
    name: str
    value: str

    @property
    def given(self) -> str:
        return f"{self.word} {self.name} {self.value}"


def mca_settings(text: str) -> list[McaSetting]:
    """The MCA parameters mpirun options set, in order; none for text mpirun would not take (the checks above
    say why)."""
    try:
        args = split_args("", text)
        return [McaSetting(option.word, *option.values)
                for option in _given_options("", args, _anyones_arity(args)) if option.key in MCA_OPTIONS]
    except CommandError:
        return []


# The MCA parameters that name network interfaces, each a comma list of interface names or of networks in
# CIDR notation (Open MPI reads an entry that starts with a digit as a network: "192.168.0.0/16").
# Only the include lists: an exclude list may name interfaces a node lacks (nothing is excluded there), as
# Open MPI's own defaults do.
INTERFACE_MCA_PARAMS = ("btl_tcp_if_include", "oob_tcp_if_include")


def interfaces_named(text: str) -> list[tuple[McaSetting, str]]:
    """Each interface mpirun options name by its name, with the setting that names it; networks are left out."""
    return [(setting, entry) for setting in mca_settings(text) if setting.name in INTERFACE_MCA_PARAMS
            for entry in setting.value.split(",") if entry and not entry[0].isdigit() and "/" not in entry]


def _check_user_mca(field_name: str, word: str, name: str, value: str, rule: OptionRule) -> None:
    _check_mca(field_name, word, name, value)
    built_in = not any(forbidden in name for forbidden in USER_MCA_FORBIDDEN_WORDS) and any(
        name_re.fullmatch(name) and value_re.fullmatch(value) for name_re, value_re in BUILTIN_MCA_FAMILIES
    )
    if built_in or any(pattern.fullmatch(f"{name} {value}") for pattern in rule.patterns):
        return
    raise CommandError(
        field_name,
        _("%(option)s %(name)s %(value)s: not an MCA parameter and value users may set (allowed: component choices btl, "
          "pml, mtl, coll, osc; btl_tcp_if_include and the like; btl_tcp_, btl_vader_, btl_openib_, pml_ob1_, pml_ucx_, "
          "coll_tuned_ tuning; mpi_leave_pinned, mpi_warn_on_fork, mpi_yield_when_idle); an administrator can allow "
          "more") % {"option": word, "name": name, "value": value},
    )


def _allowed_words(options: Mapping[str, OptionRule]) -> str:
    shown = {"x": "-x NAME=value", "mca": "--mca NAME VALUE"}
    return ", ".join(shown.get(key, _spelled(key)) for key in options)


def validate_extra_args(text: str, options: Mapping[str, OptionRule] | None = None) -> list[str]:
    """A user's OPENMPI_EXTRA_ARGS as mpirun arguments: every option on the allow-list (`options`, by default
    the built-in one; see allowed_options), with a value it allows. The first wrong one is named."""
    field_name = "extra_args"
    rules = BUILTIN_OPTIONS if options is None else options
    _check_text(field_name, text)
    args = split_args(field_name, text)

    def arity(key: str, position: int) -> int:
        rule = rules.get(key)
        if rule is None:
            raise CommandError(field_name, _("%(option)s is not among the mpirun options allowed here (%(allowed)s); an "
                                             "administrator can allow more")
                               % {"option": args[position], "allowed": _allowed_words(rules)})
        return _ARITY[rule.kind]

    for option in _given_options(field_name, args, arity):
        rule = rules[option.key]
        word, values = option.word, option.values
        if rule.kind == "mca":
            _check_user_mca(field_name, word, values[0], values[1], rule)
        elif rule.kind == "export":
            # Any name the variable rules do not reserve is allowed; an administrator's -x lines add nothing.
            _check_export(field_name, word, values[0])
        elif rule.kind == "value":
            _check_placement(field_name, word, option.key, values[0])
            _check_safe_value(field_name, word, values[0])
            if not any(pattern.fullmatch(values[0]) for pattern in rule.patterns):
                raise CommandError(field_name, _("%(option)s %(value)s: not a value allowed here")
                                   % {"option": word, "value": values[0]})
    # What holds for everyone holds here too, so that what is accepted now is what the launch accepts.
    check_mpirun_options(field_name, text)
    return args


def boot_file_path(code_dir_name: str, boot_file: str) -> str:
    """The boot file's absolute path in the container, refusing anything that leaves the code directory."""
    cleaned = boot_file.strip()
    parts = [part for part in cleaned.split("/") if part not in ("", ".")]
    if not parts or cleaned.startswith("/") or ".." in parts:
        raise CommandError("boot_file", "must be a path inside the code directory, such as train.py")
    if not parts[-1].endswith(".py"):
        raise CommandError("boot_file", "must be a Python file (.py)")
    return f"{JOB_DIR}/{code_dir_name}/" + "/".join(parts)


def parameter_args(parameters: Iterable[tuple[str, str]]) -> list[str]:
    args = []
    for name, value in parameters:
        if not PARAM_NAME_RE.match(name):
            raise CommandError("parameters", _("parameter name %(name)s must be 1-64 of letters, digits, '-' and '_'")
                               % {"name": repr(name)})
        args.append(f"--{name}={value}")
    return args


def tune_file_text(worker0_env: Mapping[str, str], prefixes: Sequence[str]) -> str:
    """`-x NAME` for each of worker-0's non-empty variables whose name starts with a tune prefix."""
    names = [
        name
        for name, value in worker0_env.items()
        if value != "" and ENV_NAME_RE.match(name) and any(name.startswith(prefix) for prefix in prefixes)
    ]
    return "".join(f"-x {name}\n" for name in sorted(names))


def hostfile_text(worker_hostnames: Sequence[str], processes_per_node: int) -> str:
    return "".join(f"{host} slots={processes_per_node}\n" for host in worker_hostnames)


def build_launch_command(inputs: LaunchInputs) -> LaunchCommand:
    if inputs.processes_per_node < 1:
        raise CommandError("spec", _("the spec gives no process per node"))
    if not inputs.worker_hostnames:
        raise CommandError("node_count", _("a job needs at least one node"))
    np = inputs.processes_per_node * len(inputs.worker_hostnames)
    boot_path = boot_file_path(inputs.code_dir_name, inputs.boot_file)
    # The users' allow-list was applied at submission, with the administrator's list of then; what holds
    # for everyone is checked again here, on the defaults the job copied and on its own arguments.
    bind = check_mpirun_options("bind_args", inputs.bind_args)
    x = check_mpirun_options("x_args", inputs.x_args)
    mca = check_mpirun_options("mca_args", inputs.mca_args)
    extra = check_mpirun_options("extra_args", inputs.extra_args)
    params = parameter_args(inputs.parameters)
    python = split_args("python", inputs.python) or ["python"]

    variables = {
        "OPENMPI_NP": str(np),
        "OPENMPI_HOST_FILE_PATH": HOSTFILE_PATH,
        "SSHD_PORT": str(inputs.sshd_port),
        "TUNE_ENV_FILE": TUNE_FILE_PATH,
        "OPENMPI_BIND_ARGS": inputs.bind_args,
        "OPENMPI_X_ARGS": inputs.x_args,
        "OPENMPI_MCA_ARGS": inputs.mca_args,
        "OPENMPI_EXTRA_ARGS": inputs.extra_args,
    }
    argv = [
        "mpirun",
        "-np", str(np),
        "-hostfile", HOSTFILE_PATH,
        "-mca", "plm_rsh_args", f"-p {inputs.sshd_port}",
        "-tune", TUNE_FILE_PATH,
        *bind, *x, *mca, *extra,
        *python, boot_path, *params,
    ]
    program = shlex.join([*python, boot_path, *params])
    template = (
        'mpirun -np ${OPENMPI_NP} -hostfile ${OPENMPI_HOST_FILE_PATH} -mca plm_rsh_args "-p ${SSHD_PORT}" '
        "-tune ${TUNE_ENV_FILE} ${OPENMPI_BIND_ARGS} ${OPENMPI_X_ARGS} ${OPENMPI_MCA_ARGS} "
        "${OPENMPI_EXTRA_ARGS} " + program
    )
    return LaunchCommand(
        template=template,
        argv=argv,
        expanded=shlex.join(argv),
        variables=variables,
        hostfile=hostfile_text(inputs.worker_hostnames, inputs.processes_per_node),
        tune_file=tune_file_text(inputs.worker0_env, inputs.tune_prefixes),
        working_dir=f"{JOB_DIR}/{inputs.code_dir_name}",
    )
