"""`runconsole`: the whole console on its embedded defaults, in the foreground; Ctrl-C stops what it started.

Its children are supervised: one that crashes is started again, as is Celery beat or a worker that hangs
(jobs.management.process_watch), and none outlives it.
"""

import signal
import subprocess
import time
from pathlib import Path
from urllib.parse import urlparse

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand

from console import services
from console.supervisor import Supervisor, end_with_parent
from jobs import localcluster, localstore
from jobs.images import registry
from jobs.management.commands.localstore import other_store_configured
from jobs.management.process_watch import ProcessWatch
from jobs.models import ConsoleProcess


def local_address(host: str) -> str:
    """Where this machine reaches a server listening on `host`."""
    return {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)


class Command(BaseCommand):
    def start_object_store(self, children: Supervisor, logs: Path, nodes_reach: str) -> None:
        """SeaweedFS where the local cluster's nodes reach it, registered as the storage "local"."""
        state, port = Path(settings.LOCALSTORE_STATE_DIR), settings.LOCALSTORE_BASE_PORT
        localstore.keys(state)
        argv = localstore.server_argv(state, nodes_reach, port)
        self.stdout.write(f"starting the object store (SeaweedFS) on {nodes_reach}:{port}")
        children.add("object store", lambda: services.start_object_store(argv, nodes_reach, port,
                                                                         logs / "objectstore.log", end_with_parent))
        call_command("localstore", "register", localstore.endpoint(nodes_reach, port), stdout=self.stdout)

    def start_image_registry(self, children: Supervisor, logs: Path) -> None:
        """The read-only registry nodes pull the engine images' layers from (jobs.images.registry)."""
        port = settings.IMAGE_REGISTRY_PORT
        if not port or registry.binary() is None:
            self.stdout.write("no image registry (IMAGE_REGISTRY_PORT is 0, or docker-registry is not installed): "
                              "nodes get whole image archives")
            return
        if services.port_answers("127.0.0.1", port):
            self.stdout.write(f"using the image registry that answers on 127.0.0.1:{port}")
            return
        self.stdout.write(f"starting the image registry on 127.0.0.1:{port}")
        text = registry.config(registry.storage_dir(), port, read_only=True)
        children.add("image registry", lambda: registry.start(settings.VAR_DIR / "image-registry.yml", port, text,
                                                              logs / "image-registry.log", end_with_parent))

    help = "Migrate, seed, bring up the local cluster, Redis (if none answers), a Celery worker and the web server."

    def add_arguments(self, parser):
        # 127.0.0.1 unless told otherwise (CONSOLE_BIND or --host): the local defaults are for this machine only.
        parser.add_argument("--host", default=settings.CONSOLE_BIND, help="listen address (default: CONSOLE_BIND, 127.0.0.1)")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--nodes", type=int, default=2)
        parser.add_argument("--slots", type=int, default=2)
        parser.add_argument("--no-cluster", action="store_true", help="use the nodes already registered")

    def handle(self, *args, host, port, nodes, slots, no_cluster, **options):
        children = Supervisor(say=self.stderr.write)
        cluster_up = False
        logs = settings.VAR_DIR / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        stopping = False

        def request_stop(*_):
            nonlocal stopping
            stopping = True

        # Ctrl-C reaches the whole process group: note it here and stop the children in order,
        # rather than reporting their exit as a failure.
        signal.signal(signal.SIGTERM, request_stop)
        signal.signal(signal.SIGINT, request_stop)
        try:
            call_command("migrate", interactive=False, verbosity=0)
            call_command("seedconsole", stdout=self.stdout)
            if not no_cluster:
                call_command("localcluster", "up", nodes=nodes, slots=slots, stdout=self.stdout)
                cluster_up = True
            redis = urlparse(settings.REDIS_URL)
            redis_host, redis_port = redis.hostname or "127.0.0.1", redis.port or 6379
            if services.port_answers(redis_host, redis_port):
                self.stdout.write(f"using the Redis at {redis_host}:{redis_port}")
            else:
                self.stdout.write(f"starting Redis on {redis_host}:{redis_port}")
                children.add("redis", lambda: services.start_redis(redis_port, logs / "redis.log", end_with_parent))
            self.start_image_registry(children, logs)
            if cluster_up and not other_store_configured():
                self.start_object_store(children, logs, nodes_reach=localcluster.gateway(settings.LOCALCLUSTER_SUBNET))
            # Runs and control work in worker processes of their own (console/settings.py, CELERY_TASK_QUEUES):
            # a full set of runs never delays a stop, a node check, a dispatch or a notification.
            runs = children.add("celery worker (runs)", lambda: services.start_celery_worker(
                {}, logs / "celery-worker-runs.log", preexec_fn=end_with_parent, queues="runs", name="runs"))
            control = children.add("celery worker (control)", lambda: services.start_celery_worker(
                {}, logs / "celery-worker-control.log", concurrency=settings.CONTROL_THREADS,
                preexec_fn=end_with_parent, queues="control", name="control"))
            shells = children.add("celery worker (shells)", lambda: services.start_celery_worker(
                {}, logs / "celery-worker-shells.log", concurrency=settings.SHELL_THREADS,
                preexec_fn=end_with_parent, queues="shells", name="shells"))
            beat = children.add("celery beat", lambda: services.start_celery_beat({}, logs / "celery-beat.log",
                                                                                  end_with_parent))
            # Beat or a worker that hangs rather than exits is killed, then started again as if it had crashed.
            watch = ProcessWatch(children, beat, {ConsoleProcess.Role.RUNS_WORKER: runs,
                                                  ConsoleProcess.Role.CONTROL_WORKER: control,
                                                  ConsoleProcess.Role.SHELLS_WORKER: shells}, self.stderr.write)
            # uvicorn with the console's own HTTP protocol (a deadline on each request's headers).
            web = children.add("web server", lambda: subprocess.Popen(
                services.web_server_command(host, port), cwd=settings.BASE_DIR, preexec_fn=end_with_parent))
            services.wait_for_port(local_address(host), port, 30, web.process)
            shown = "localhost" if host in ("0.0.0.0", "::", "127.0.0.1", "::1", "localhost") else host
            shown = f"[{shown}]" if ":" in shown else shown
            self.stdout.write(self.style.SUCCESS(f"The console is up at http://{shown}:{port}/  (Ctrl-C stops it)"))
            self.stdout.write(f"logs: {logs}")
            # A child that dies is started again (see console.supervisor); only Ctrl-C or SIGTERM stops all.
            while not stopping:
                time.sleep(0.5)
                if not stopping:
                    children.poll()
                    watch.poll()
        except KeyboardInterrupt:
            pass
        finally:
            self.stdout.write("stopping the console")
            children.stop_all(services.stop)
            if cluster_up:
                call_command("localcluster", "down", stdout=self.stdout)
