"""Where a job's object-store input and output are in its containers, as on the reference platform (pure).

A data_url or train_url that names an object store (s3://, obs://) reaches the program as a local path:
the input is brought to every worker before the program starts, at /home/ma-user/modelarts/inputs/data_url_0/,
and what the program writes at /home/ma-user/modelarts/outputs/train_url_0/ is uploaded to train_url. The
program gets the local paths as --data_url and --train_url, and the URLs as typed in DATA_URL and TRAIN_URL.
A value that names no scheme is a path in the container, handed over as it is.
"""

from __future__ import annotations

from collections.abc import Sequence

from jobs.object_store.urls import has_scheme

CONTAINER_HOME = "/home/ma-user"
INPUTS_DIR = f"{CONTAINER_HOME}/modelarts/inputs"
OUTPUTS_DIR = f"{CONTAINER_HOME}/modelarts/outputs"
# The parameters the platform fills with local paths, and the folder each one's data is in.
DATA_URL_FOLDER = "data_url_0"
TRAIN_URL_FOLDER = "train_url_0"
LOCAL_FOLDERS = {"data_url": (INPUTS_DIR, DATA_URL_FOLDER), "train_url": (OUTPUTS_DIR, TRAIN_URL_FOLDER)}
URL_VARIABLES = {"data_url": "DATA_URL", "train_url": "TRAIN_URL"}


def local_path(name: str) -> str:
    root, folder = LOCAL_FOLDERS[name]
    return f"{root}/{folder}/"


def program_parameters(parameters: Sequence[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """The parameters as the program gets them: an object URL in data_url or train_url becomes its local path."""
    return tuple((name, local_path(name) if name in LOCAL_FOLDERS and has_scheme(value) else value)
                 for name, value in parameters)


def url_variables(parameters: Sequence[tuple[str, str]]) -> dict[str, str]:
    """DATA_URL and TRAIN_URL, the object URLs as typed, for a program that wants to know where its data is."""
    return {URL_VARIABLES[name]: value for name, value in parameters if name in URL_VARIABLES and has_scheme(value)}


def object_url_of(parameters: Sequence[tuple[str, str]], name: str) -> str:
    """The object URL typed as data_url or train_url, "" when that parameter is a path or absent."""
    return next((value for key, value in parameters if key == name and has_scheme(value)), "")
