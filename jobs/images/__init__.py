"""Engine images: the recipes the console ships and their build, offline, on the console's host.

An engine version names an image. The shipped ones are built here from Debian's packages (a minbase
root filesystem made by debootstrap with the engine's packages, imported into Podman, then a short
Containerfile for the job's account), tagged with a hash of their recipe so nothing is rebuilt when
nothing changed, and saved as an archive the runtime copies to nodes that lack the image.
"""
