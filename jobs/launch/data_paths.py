"""Where a job's object-store inputs and output are in its containers, as on the reference platform (pure).

A data_url or train_url that names an object store (s3://, obs://) reaches the program as a local path:
the input is brought to every worker before the program starts, at /home/ma-user/modelarts/inputs/data_url_0/,
and what the program writes at /home/ma-user/modelarts/outputs/train_url_0/ is uploaded to train_url. The
program gets the local paths as --data_url and --train_url, and the URLs as typed in DATA_URL and TRAIN_URL.
A value that names no scheme is a path in the container, handed over as it is.

Further inputs, as the reference's list of inputs, are parameters named data_url_1 ... data_url_9: each is
brought the same way, to /home/ma-user/modelarts/inputs/data_url_N_0/ (the parameter's name, then the index of
the input's one location, as for data_url), given as --data_url_N, its URL in DATA_URL_N.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from jobs.object_store.urls import has_scheme

CONTAINER_HOME = "/home/ma-user"
INPUTS_DIR = f"{CONTAINER_HOME}/modelarts/inputs"
OUTPUTS_DIR = f"{CONTAINER_HOME}/modelarts/outputs"
# The output's folder: the one train_url's files are uploaded from.
TRAIN_URL_FOLDER = "train_url_0"
OUTPUT_NAME = "train_url"
# data_url, and the further inputs data_url_1 ... data_url_9.
INPUT_NAME = re.compile(r"data_url(_[1-9])?")


def is_input(name: str) -> bool:
    return INPUT_NAME.fullmatch(name) is not None


def is_data_location(name: str) -> bool:
    """A parameter the platform fills with a local path when it names an object store: an input or the output."""
    return name == OUTPUT_NAME or is_input(name)


def location_path(value: str) -> str:
    """A data location typed as a path, as it is compared with shared file systems' folders: without its trailing
    "/" (the root stays "/"), nothing else changed, so the submission's check and the mounts read it alike."""
    return value.rstrip("/") or "/"


def folder_of(name: str) -> str:
    """The folder an input or the output is in, under the inputs or outputs folder: data_url_0, data_url_1_0..."""
    if not is_data_location(name):
        raise ValueError(f"{name} is neither an input (data_url, data_url_1 ... data_url_9) nor train_url")
    return f"{name}_0"


def local_path(name: str) -> str:
    return f"{OUTPUTS_DIR if name == OUTPUT_NAME else INPUTS_DIR}/{folder_of(name)}/"


def program_parameters(parameters: Sequence[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """The parameters as the program gets them: an object URL in an input or train_url becomes its local path."""
    return tuple((name, local_path(name) if is_data_location(name) and has_scheme(value) else value)
                 for name, value in parameters)


def url_variables(parameters: Sequence[tuple[str, str]]) -> dict[str, str]:
    """DATA_URL, DATA_URL_N and TRAIN_URL, the object URLs as typed, for a program that wants to know where its
    data is."""
    return {name.upper(): value for name, value in parameters if is_data_location(name) and has_scheme(value)}


def object_url_of(parameters: Sequence[tuple[str, str]], name: str) -> str:
    """The object URL typed as this input or train_url, "" when that parameter is a path or absent."""
    return next((value for key, value in parameters if key == name and has_scheme(value)), "")


def object_inputs(parameters: Sequence[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """The inputs that name an object store, in the order given, as (name, URL)."""
    return tuple((name, value) for name, value in parameters if is_input(name) and has_scheme(value))
