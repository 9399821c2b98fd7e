#!/usr/bin/env python
import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    # The state the settings read (var/, the secret key, the SQLite files), made before they are read.
    from console.state import prepare

    prepare()
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
