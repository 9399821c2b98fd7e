"""OPENMPI_EXTRA_ARGS as an allow-list, the administrator's additions to it, and what holds for everyone's options."""

import pytest
from django.core.exceptions import ValidationError

from jobs.launch.command_builder import (
    BUILTIN_OPTIONS,
    CommandError,
    allowed_options,
    check_mpirun_options,
    validate_extra_args,
)
from jobs.models import LauncherDefaults

# Each of these got through the old deny-list (all but a few did); each escapes the platform's launch:
# it replaces the launcher or the program, moves or multiplies the ranks, reads settings from a file,
# loads code into the platform's processes, or runs a shell command on the other nodes.
ESCAPES = {
    "--mca orte_rsh_agent /bin/sh": "orte_rsh_agent",
    "--mca pls_rsh_agent /tmp/a": "pls_rsh_agent",
    "-mca plm_rsh_agent /tmp/a": "plm_rsh_agent",
    "--mca orte_launch_agent /tmp/orted": "orte_launch_agent",
    "--mca orte_fork_agent /tmp/agent": "orte_fork_agent",
    "--mca mca_base_param_files /tmp/p.conf": "mca_base_param_files",
    "--mca orte_tag_output 0": "orte_tag_output",
    "--mca plm isolated": "plm",
    "--mca plm_rsh_no_tree_spawn 0": "plm_rsh_no_tree_spawn",
    "-launch-agent /tmp/orted": "-launch-agent",
    "--launch-agent /tmp/orted": "--launch-agent",
    "--prefix /tmp/ompi": "--prefix",
    "-prefix /tmp/ompi": "-prefix",
    "--app /tmp/appfile": "--app",
    "--rankfile /tmp/rf": "--rankfile",
    "-rf /tmp/rf": "-rf",
    "-npernode 8": "-npernode",
    "-N 8": "-N",
    "--map-by ppr:8:node": "ppr:8:node",
    "--map-by slot:OVERSUBSCRIBE": "slot:OVERSUBSCRIBE",
    "--map-by slot --oversubscribe": "--oversubscribe",
    "--map-by node:nooversubscribe,oversubscribe": "node:nooversubscribe,oversubscribe",
    "-x LD_PRELOAD=/tmp/evil.so": "LD_PRELOAD",
    "-x OMPI_MCA_plm_rsh_agent=/tmp/a": "OMPI_MCA_plm_rsh_agent",
    "-x OPAL_PREFIX=/tmp/ompi": "OPAL_PREFIX",
    "-x MA_NUM_HOSTS=9": "MA_NUM_HOSTS",
    "-x HOME=/tmp": "HOME",
    "-x PATH=/tmp": "PATH",
    "-x BASH_ENV=/tmp/rc": "BASH_ENV",
    "/bin/sh -c id": "/bin/sh",
    "python /tmp/other.py": "python",
    "--report-bindings -- /bin/sh": "--",
    "-wdir /tmp": "-wdir",
    "--path /tmp": "--path",
    "--preload-files /etc/passwd": "--preload-files",
    "-am /tmp/params": "-am",
    "-tune /tmp/other-tune": "-tune",
    "--allow-run-as-root": "--allow-run-as-root",
    "-gmca plm_rsh_agent x": "-gmca",
    "--mca x '$(touch /tmp/f)'": "x",
    "--mca btl_tcp_if_include 'eth0;id'": "btl_tcp_if_include",
    "--mca btl_tcp_if_include '`id`'": "btl_tcp_if_include",
    "-host a,b": "-host",
    "--default-hostfile h": "--default-hostfile",
    "-np 64": "-np",
    "--output-filename /tmp/o": "--output-filename",
    "--timestamp-output": "--timestamp-output",
    "--bind-to core:overload-allowed": "core:overload-allowed",
    "--mca btl_openib_device_param_files /tmp/p": "btl_openib_device_param_files",
}


@pytest.mark.parametrize(("extra", "named"), ESCAPES.items())
def test_every_escape_is_refused_naming_what_is_wrong(extra, named):
    with pytest.raises(CommandError) as caught:
        validate_extra_args(extra)
    assert caught.value.field == "extra_args"
    assert named in caught.value.message


ALLOWED = [
    "--report-bindings",
    "-report-bindings --display-map --display-allocation -v --verbose --tag-output --display-devel-map",
    "-x NCCL_DEBUG=INFO -x MY_FLAG -x 'GREETING=olá  mundo $(id) ; `id`'",
    "-x PATH=/opt/tools/bin:/usr/local/bin:/usr/bin:/bin -x LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/lib",
    "--mca btl_tcp_if_include 10.0.0.0/24 -mca oob_tcp_if_include eth0,ib0",
    "--mca btl ^openib,vader --mca pml ob1 --mca coll_tuned_use_dynamic_rules 1 --mca btl_tcp_eager_limit 65536",
    "--mca mpi_warn_on_fork 0 --mca pml_ucx_tls any",
    "-bind-to none -map-by slot",
    "--bind-to core:if-supported --map-by socket:PE=2,NOOVERSUBSCRIBE",
    "--map-by node:NOOVERSUBSCRIBE",
    "",
]


@pytest.mark.parametrize("extra", ALLOWED)
def test_the_built_in_options_pass_with_their_values_kept(extra):
    args = validate_extra_args(extra)
    assert check_mpirun_options("extra_args", extra) == args


@pytest.mark.parametrize("extra", ["--bind-to", "-x", "--mca btl", "--report-bindings yes", "--map-by=slot"])
def test_a_missing_or_stray_value_is_refused(extra):
    with pytest.raises(CommandError):
        validate_extra_args(extra)


def test_an_option_not_on_the_list_says_it_can_be_allowed_by_an_administrator():
    with pytest.raises(CommandError) as caught:
        validate_extra_args("--display-topo")
    assert "--display-topo is not among the mpirun options allowed here" in caught.value.message
    assert "an administrator can allow more" in caught.value.message


# ---- the administrator's additions ----

EXTENSION = """
# what our users asked for
--display-topo
--timeout [0-9]+
--mca coll_hcoll_enable [01]
--bind-to core:overload-allowed
"""


def test_the_administrators_lines_extend_the_list():
    options = allowed_options(EXTENSION)

    assert validate_extra_args("--display-topo --timeout 600 --mca coll_hcoll_enable 1", options)
    assert validate_extra_args("--bind-to core:overload-allowed --bind-to none", options)
    assert set(BUILTIN_OPTIONS) < set(options)


@pytest.mark.parametrize("extra", ["--timeout soon", "--mca coll_hcoll_enable 2", "--display-topo x", "--mca coll_hcoll_np 1"])
def test_an_administrators_regex_must_match_the_whole_value(extra):
    with pytest.raises(CommandError):
        validate_extra_args(extra, allowed_options(EXTENSION))


def test_what_holds_for_everyone_holds_through_the_administrators_lines_too():
    options = allowed_options("--timeout .*\n--mca .*\n--output-filename .*")

    for extra, named in [("--timeout 'a;b'", "--timeout"), ("--mca plm_rsh_agent /tmp/x", "plm_rsh_agent"),
                         ("--mca orte_rsh_agent sh", "orte_rsh_agent"), ("--mca x '$(id)'", "x"),
                         ("--output-filename '/tmp/$(id)'", "--output-filename"), ("--prefix /tmp", "--prefix")]:
        with pytest.raises(CommandError) as caught:
            validate_extra_args(extra, options)
        assert named in caught.value.message
    assert validate_extra_args("--mca plm_rsh_num_concurrent 8", options)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("--report-bindings\nbogus", "line 2: 'bogus' is not an mpirun option"),
        ("--prefix", "line 1: --prefix cannot be allowed"),
        ("-np \\d+", "line 1: -np cannot be allowed"),
        ("--timeout (slot", "line 1: '(slot' is not a regular expression"),
        ("--timeout (?=slot)", "is not a regular expression RE2 can run"),
        ("--report-bindings (yes|no)", "--report-bindings is a flag here"),
        ("--bind-to", "--bind-to takes a value"),
        ("--foo x+\n--foo", "line 2: --foo takes a value"),
        ("--timeout " + "a" * 501, "longer than 500"),
    ],
)
def test_a_line_the_list_cannot_use_is_refused_saying_which(text, said):
    with pytest.raises(CommandError) as caught:
        allowed_options(text)
    assert caught.value.field == "extra_options_allowed"
    assert said in caught.value.message


@pytest.mark.django_db
def test_the_launcher_defaults_refuse_a_bad_list_and_a_reserved_default_on_their_fields():
    defaults = LauncherDefaults.current()
    defaults.extra_options_allowed = "--timeout (slot"
    defaults.mca_args = "-mca pml ob1 -mca orte_fork_agent /tmp/agent"
    defaults.x_args = "-x LD_LIBRARY_PATH -x OMPI_MCA_plm_rsh_agent=/tmp/a"
    defaults.bind_args = "-bind-to none -map-by slot:OVERSUBSCRIBE"

    with pytest.raises(ValidationError) as caught:
        defaults.clean()

    assert set(caught.value.message_dict) == {"extra_options_allowed", "mca_args", "x_args", "bind_args"}
    assert "regular expression" in caught.value.message_dict["extra_options_allowed"][0]
    assert "orte_fork_agent" in caught.value.message_dict["mca_args"][0]


@pytest.mark.django_db
def test_the_launcher_defaults_value_check_covers_the_admins_mca_args():
    defaults = LauncherDefaults.current()
    defaults.mca_args = "-mca btl_tcp_if_include '$(touch /tmp/f)'"

    with pytest.raises(ValidationError) as caught:
        defaults.clean()

    assert "may hold only" in caught.value.message_dict["mca_args"][0]


@pytest.mark.django_db
def test_the_reference_defaults_and_a_good_list_pass_the_administrators_check():
    defaults = LauncherDefaults.current()
    defaults.extra_options_allowed = EXTENSION
    defaults.clean()
    # Admin-controlled, so not held to the users' list: plm_rsh_no_tree_spawn is no user's to set.
    with pytest.raises(CommandError):
        validate_extra_args(defaults.mca_args)
    for field in ("bind_args", "x_args", "mca_args"):
        check_mpirun_options(field, getattr(defaults, field))


@pytest.mark.parametrize("extra", ["--mca btl_tcp_if_include 'eth0\n'", "--mca 'plm\n' isolated", "'--prefix\n' /tmp",
                                   "-x 'LD_PRELOAD\n=/tmp/evil.so'"])
def test_a_trailing_line_break_does_not_slip_through_a_pattern(extra):
    # `$` matches before a final line break; a line break on the orted's ssh command line ends a command.
    with pytest.raises(CommandError):
        validate_extra_args(extra)
    with pytest.raises(CommandError):
        check_mpirun_options("mca_args", extra)
