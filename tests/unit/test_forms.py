"""The job form as the creation page uses it: rows, auto stop, Rebuild's initial data, the command preview."""

import re

import pytest
from django.http import QueryDict

from jobs.code_dirs.service import register
from jobs.launch.masking import MASK
from jobs.models import CodeDirectory, Engine, EngineVersion, LauncherDefaults, ResourceSpec
from jobs.pages.preview import preview
from jobs.submission.forms import MAX_ENV_VARS, TrainingJobForm, page_data
from tests.fixtures import add_nodes

pytestmark = pytest.mark.django_db


@pytest.fixture
def catalog(tmp_path):
    code = tmp_path / "mnist"
    (code / "models").mkdir(parents=True)
    (code / "train.py").write_text("print('hi')\n")
    (code / "models" / "net.py").write_text("")
    (code / "README.md").write_text("")
    engine = EngineVersion.objects.create(engine=Engine.objects.create(name="MPI"), version="mpi-4.1", python="/usr/bin/python3")
    spec = ResourceSpec.objects.create(name="cpu-2", cpu_cores=2, memory_gb=4, cpu_slots_per_node=2, max_nodes=4)
    add_nodes(spec, 4)
    LauncherDefaults.current()
    return {"engine": engine, "spec": spec, "code_dir": register("mnist", code, sharing="everyone")}


def page_post(catalog, **overrides) -> QueryDict:
    """The creation page's POST: scalar fields plus rows of name/value inputs, as the browser sends them."""
    fields = {
        "name": "job-1", "description": "", "engine": catalog["engine"].pk, "code_dir": catalog["code_dir"].pk,
        "boot_file": "train.py", "data_url": "/cache/data", "train_url": "", "spec": catalog["spec"].pk, "pool": "",
        "node_count": "1", "extra_args": "", "auto_stop": "", "auto_stop_custom": "",
        "param_name": ["lr", "epochs"], "param_value": ["0.01", "3"], "env_name": ["GREETING"], "env_value": ["olá  mundo "],
    }
    fields.update(overrides)
    post = QueryDict(mutable=True)
    for key, value in fields.items():
        post.setlist(key, [str(item) for item in value] if isinstance(value, list) else [str(value)])
    return post


def test_page_rows_become_the_lists_the_api_posts_and_blank_rows_are_dropped(catalog):
    post = page_post(catalog, param_name=["lr", "", "epochs"], param_value=["0.01", "", "3"])

    form = TrainingJobForm(page_data(post))

    assert form.is_valid(), form.errors
    assert form.cleaned_data["parameters"] == [{"name": "lr", "value": "0.01"}, {"name": "epochs", "value": "3"}]
    assert form.cleaned_data["env"] == {"GREETING": "olá  mundo "}, "values are kept verbatim"
    assert form.job_parameters()[0] == {"name": "data_url", "value": "/cache/data"}


def test_a_variable_given_twice_on_the_page_is_refused_naming_it(catalog):
    form = TrainingJobForm(page_data(page_post(catalog, env_name=["A", "A"], env_value=["1", "2"])))

    assert not form.is_valid()
    assert form.errors["env"] == ["Variable A is given twice."]


def test_platform_names_and_too_many_variables_are_refused(catalog):
    reserved = TrainingJobForm(page_data(page_post(catalog, env_name=["MA_HOME"], env_value=["x"])))
    too_many = TrainingJobForm(page_data(page_post(
        catalog, env_name=[f"V{n}" for n in range(MAX_ENV_VARS + 1)], env_value=["x"] * (MAX_ENV_VARS + 1))))

    assert "reserved for the platform" in reserved.errors["env"][0]
    assert too_many.errors["env"] == [f"At most {MAX_ENV_VARS} environment variables."]


@pytest.mark.parametrize(("choice", "custom", "hours"), [("", "", None), ("4", "", 4), ("custom", "36", 36)])
def test_auto_stop_choices_become_hours(catalog, choice, custom, hours):
    form = TrainingJobForm(page_data(page_post(catalog, auto_stop=choice, auto_stop_custom=custom)))

    assert form.is_valid(), form.errors
    assert form.cleaned_data["auto_stop_hours"] == hours


@pytest.mark.parametrize(("choice", "custom", "field"), [("custom", "", "auto_stop_custom"), ("custom", "73", "auto_stop_custom"), ("3", "", "auto_stop")])
def test_a_wrong_auto_stop_is_refused_on_its_own_field(catalog, choice, custom, field):
    form = TrainingJobForm(page_data(page_post(catalog, auto_stop=choice, auto_stop_custom=custom)))

    assert not form.is_valid()
    assert list(form.errors) == [field]


def test_the_api_shape_still_validates_with_no_page_field(catalog):
    form = TrainingJobForm({"name": "api-job", "engine": "mpi-4.1", "code_dir": "mnist", "boot_file": "models/net.py",
                            "spec": "cpu-2", "node_count": 1, "env": {"TOKEN": "x"}, "auto_stop_hours": 5,
                            "parameters": [{"name": "lr", "value": 0.1}]})

    assert form.is_valid(), form.errors
    assert form.cleaned_data["auto_stop_hours"] == 5
    assert form.cleaned_data["env"] == {"TOKEN": "x"}


def test_an_invalid_name_and_a_boot_file_outside_the_code_directory_get_their_messages_and_the_rest_is_kept(catalog):
    form = TrainingJobForm(page_data(page_post(catalog, name="bad name!", boot_file="../escape.py", description="kept")))

    assert not form.is_valid()
    assert set(form.errors) == {"name", "boot_file"}
    assert form.errors["boot_file"] == ["Give a path inside the code directory, such as train.py."]
    assert form["description"].value() == "kept"
    assert form.parameter_rows == [{"name": "lr", "value": "0.01"}, {"name": "epochs", "value": "3"}]
    assert form.env_rows == [{"name": "GREETING", "value": "olá  mundo "}]


def test_a_boot_file_that_is_not_a_python_file_of_the_directory_is_refused(catalog):
    form = TrainingJobForm(page_data(page_post(catalog, boot_file="missing.py")))

    assert form.errors["boot_file"] == ["missing.py is not a Python file of mnist."]


def test_a_fresh_form_offers_a_generated_name_that_the_form_accepts():
    first, second = TrainingJobForm(), TrainingJobForm()

    assert first.initial["name"] != second.initial["name"]
    assert "name" not in TrainingJobForm({"name": first.initial["name"]}).errors


def test_rebuild_fills_the_form_with_what_resubmits_as_the_same_job(catalog, make_job):
    original = TrainingJobForm(page_data(page_post(catalog, auto_stop="custom", auto_stop_custom="10", node_count="2")))
    assert original.is_valid(), original.errors
    job = make_job(
        name="job-1", engine_version=catalog["engine"], code_dir=catalog["code_dir"], boot_file="train.py",
        parameters=original.job_parameters(), env=original.cleaned_data["env"], spec=catalog["spec"], node_count=2,
        auto_stop_hours=10)

    initial = TrainingJobForm.initial_from_job(job)
    rows = TrainingJobForm(initial=initial)
    resubmitted = TrainingJobForm(page_data(page_post(
        catalog, **{key: "" if value is None else value for key, value in initial.items() if key not in ("parameters", "env")},
        param_name=[row["name"] for row in rows.parameter_rows], param_value=[row["value"] for row in rows.parameter_rows],
        env_name=[row["name"] for row in rows.env_rows], env_value=[row["value"] for row in rows.env_rows])))

    assert initial["data_url"] == "/cache/data" and initial["auto_stop"] == "custom"
    assert resubmitted.is_valid(), resubmitted.errors
    assert resubmitted.job_parameters() == job.parameters
    assert resubmitted.cleaned_data["env"] == job.env
    assert resubmitted.cleaned_data["auto_stop_hours"] == 10
    assert resubmitted.cleaned_data["node_count"] == 2


def test_the_preview_shows_the_command_for_the_node_count(catalog):
    one = preview(TrainingJobForm(page_data(page_post(catalog, node_count="1"))))
    two = preview(TrainingJobForm(page_data(page_post(catalog, node_count="2"))))

    assert one["ready"] and two["ready"]
    assert (one["np"], two["np"]) == (2, 4)
    assert one["expanded"].startswith("mpirun -np 2 -hostfile /home/ma-user/.mpi/hostfile ")
    assert two["expanded"].endswith("/home/ma-user/user-job-dir/mnist/train.py --data_url=/cache/data --lr=0.01 --epochs=3")
    assert two["template"].startswith("mpirun -np ${OPENMPI_NP} -hostfile ${OPENMPI_HOST_FILE_PATH}")
    assert two["hostfile"].splitlines() == ["job-1-1-worker-0 slots=2", "job-1-1-worker-1 slots=2"]
    assert two["working_dir"] == "/home/ma-user/user-job-dir/mnist"
    assert one["boot_files"] == ["train.py", "models/net.py"]
    assert "MA_NUM_HOSTS" in two["tune_names"]


def test_the_preview_names_what_keeps_it_from_building_a_command_and_ignores_the_name(catalog):
    answer = preview(TrainingJobForm(page_data(page_post(catalog, name="bad name!", boot_file="/etc/passwd.py"))))

    assert not answer["ready"]
    assert answer["blocking"] == ["boot_file"]
    assert set(answer["errors"]) == {"name", "boot_file"}


def test_the_preview_masks_a_secret_parameter(catalog):
    answer = preview(TrainingJobForm(page_data(page_post(catalog, param_name=["api_token"], param_value=["s3cr3t-v4lue"]))))

    assert answer["ready"]
    assert "s3cr3t-v4lue" not in answer["expanded"]
    assert f"--api_token={MASK}" in answer["expanded"]


@pytest.fixture
def runnable(catalog):
    """The catalog with its code directory everyone's, so a form with no user may pick it."""
    CodeDirectory.objects.filter(pk=catalog["code_dir"].pk).update(sharing=CodeDirectory.Sharing.EVERYONE)
    return catalog


@pytest.mark.parametrize(
    ("name", "value", "said"),
    [
        ("OMPI_MCA_orte_base_help_aggregate", "$(touch /tmp/f)", "Open MPI's own settings"),
        ("OMPI_MCA_plm_rsh_agent", "/tmp/agent", "Open MPI's own settings"),
        ("OMPI_ALLOW_RUN_AS_ROOT", "1", "Open MPI's own settings"),
        ("OPAL_PREFIX", "/tmp/ompi", "Open MPI's own settings"),
        ("PMIX_MCA_ptl", "tcp", "Open MPI's own settings"),
        ("LD_PRELOAD", "/tmp/evil.so", "dynamic loader"),
        ("LD_AUDIT", "/tmp/evil.so", "dynamic loader"),
        ("HOME", "/tmp", "set by the platform to /home/ma-user"),
        ("PATH", "/opt/bin", "must keep the platform's entries /usr/local/bin:/usr/bin:/bin"),
        ("PATH", "/opt/bin:$PATH", "$PATH stays as typed"),
        ("LD_LIBRARY_PATH", "/usr/local/cuda/lib64", "must keep the platform's entries /usr/local/lib"),
        ("BASH_ENV", "/home/ma-user/rc", "every shell the platform starts"),
        ("VC_TASK_INDEX", "0", "set by the platform for each worker"),
        ("MA_HOME", "x", "reserved for the platform"),
    ],
)
def test_a_reserved_variable_is_refused_saying_why(runnable, name, value, said):
    form = TrainingJobForm(page_data(page_post(runnable, env_name=[name], env_value=[value])))

    assert not form.is_valid()
    assert len(form.errors["env"]) == 1
    assert form.errors["env"][0].startswith(f"{name}: ") and said in form.errors["env"][0], form.errors["env"]


def test_path_and_ld_library_path_may_add_entries_that_keep_the_platforms(runnable):
    form = TrainingJobForm(page_data(page_post(
        runnable, env_name=["PATH", "LD_LIBRARY_PATH"],
        env_value=["/home/ma-user/bin:/usr/local/bin:/usr/bin:/bin", "/usr/local/cuda/lib64:/usr/local/lib"])))

    assert form.is_valid(), form.errors
    assert form.cleaned_data["env"]["PATH"] == "/home/ma-user/bin:/usr/local/bin:/usr/bin:/bin"


def test_every_bad_variable_row_is_reported_not_only_the_first(runnable):
    form = TrainingJobForm(page_data(page_post(
        runnable, env_name=["GOOD", "OMPI_MCA_x", "1BAD", "LD_PRELOAD", "A", "A", "LINES"],
        env_value=["ok", "$(id)", "v", "/x.so", "1", "2", "a\nb"])))

    assert not form.is_valid()
    messages = form.errors["env"]
    assert [message.split(":")[0].split(" ")[0] for message in messages] == [
        "Variable", "OMPI_MCA_x", "'1BAD'", "LD_PRELOAD", "The"], messages
    assert messages[0] == "Variable A is given twice."


def test_the_api_shape_reports_every_bad_variable_too(runnable):
    form = TrainingJobForm({"name": "api-job", "engine": "mpi-4.1", "code_dir": "mnist", "boot_file": "train.py",
                            "spec": "cpu-2", "node_count": 1, "env": {"HOME": "/tmp", "OK": "1", "OPAL_PREFIX": "/x"}})

    assert not form.is_valid()
    assert [message.split(":")[0] for message in form.errors["env"]] == ["HOME", "OPAL_PREFIX"]


def test_extra_args_outside_the_allow_list_are_a_field_error_naming_the_option(runnable):
    form = TrainingJobForm(page_data(page_post(runnable, extra_args="--report-bindings --mca orte_rsh_agent /bin/sh")))

    assert not form.is_valid()
    assert list(form.errors) == ["extra_args"]
    assert "orte_rsh_agent" in form.errors["extra_args"][0]


def test_extra_args_are_checked_against_the_administrators_list_of_now(runnable):
    post = page_post(runnable, extra_args="--display-topo --mca coll_hcoll_enable 1")
    assert "--display-topo" in TrainingJobForm(page_data(post)).errors["extra_args"][0]

    LauncherDefaults.objects.filter(pk=1).update(extra_options_allowed="--display-topo\n--mca coll_hcoll_enable [01]\n")
    form = TrainingJobForm(page_data(post))

    assert form.is_valid(), form.errors
    assert form.cleaned_data["extra_args"] == "--display-topo --mca coll_hcoll_enable 1"
    assert preview(form)["expanded"].count("--display-topo") == 1


def test_an_unreadable_stored_list_leaves_the_built_in_one(runnable):
    LauncherDefaults.objects.filter(pk=1).update(extra_options_allowed="--timeout (slot")

    assert TrainingJobForm(page_data(page_post(runnable, extra_args="--report-bindings"))).is_valid()
    assert "extra_args" in TrainingJobForm(page_data(page_post(runnable, extra_args="--timeout 5"))).errors


def test_a_variable_name_ending_in_a_line_break_is_refused(runnable):
    form = TrainingJobForm({"name": "api-job", "engine": "mpi-4.1", "code_dir": "mnist", "boot_file": "train.py",
                            "spec": "cpu-2", "node_count": 1, "env": {"GOOD\n": "1"}})

    assert form.errors["env"] == ["'GOOD\\n' is not a valid variable name."]


def test_every_wrong_environment_row_carries_its_own_message_on_the_page(catalogue, owner):
    from django.test import Client

    client = Client()
    client.force_login(owner)
    page = client.post("/jobs/new", {"name": "rows", "engine": "MPI", "code_dir": "gpu-train", "boot_file": "train.py",
                                     "spec": "cpu", "node_count": "1",
                                     "env_name": ["GOOD", "MA_HOME", "1BAD", "GOOD", "LD_PRELOAD"],
                                     "env_value": ["1", "x", "y", "2", "/x.so"]}).content.decode()

    row_errors = re.findall(r'<ul class="errorlist" data-row-error="env"><li>(.*?)</li></ul>', page)
    assert len(row_errors) == 4, row_errors
    assert "MA_HOME" in row_errors[0] and "1BAD" in row_errors[1] and "given twice" in row_errors[2]
    assert "LD_PRELOAD" in row_errors[3]
    assert 'data-errors-for="env"' not in page, "the messages stand beside their rows, not again below"
