"""The shipped image recipes: names in the reference's style, and hashes that change only with what goes in."""

import dataclasses

from jobs.images.recipes import HOROVOD, MINDSPORE, MPI, SHIPPED


def test_the_engine_images_are_named_after_what_is_inside():
    assert HOROVOD.version.startswith("horovod_0.28.1-pytorch_2.13.0-cpu-py_3.11-debian_12-")
    assert MINDSPORE.version.startswith("mindspore_2.10.0-cpu-py_3.11-debian_12-")
    assert HOROVOD.reference == f"localhost/training-console/horovod:{HOROVOD.version}-r{HOROVOD.recipe_hash()}"
    assert set(SHIPPED) == {"mpi", "horovod", "mindspore"}


def test_a_recipes_wheels_are_part_of_its_hash():
    assert MPI.wheels == ()
    assert dataclasses.replace(MPI, wheels=("numpy",)).recipe_hash() != MPI.recipe_hash()


def test_the_wheels_depend_on_their_requirements_only():
    assert HOROVOD.wheels_hash() == dataclasses.replace(HOROVOD, packages=("python3",)).wheels_hash()
    assert HOROVOD.wheels_hash() != dataclasses.replace(HOROVOD, wheels=("torch==2.12.0",)).wheels_hash()
    assert "numpy<2" in MINDSPORE.wheels  # numpy 2 breaks MindSpore 2.10.0's compiled parts
    patched = {name for source in HOROVOD.source_wheels for name, _, _ in source.patches}
    assert patched == {"CMakeLists.txt", "horovod/torch/CMakeLists.txt"}
