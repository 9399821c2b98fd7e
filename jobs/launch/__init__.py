"""The launch plan, pure: the mpirun command, each worker's environment, masking, where each rank runs.

The form's preview, the run and the pages all build from here; nothing in it talks to a node.
"""
