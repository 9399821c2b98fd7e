import os

from django.core.wsgi import get_wsgi_application

from console.state import prepare

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
prepare()  # the state the settings read, made before they are read (console.state)
application = get_wsgi_application()
