"""virtufin_worker: the Python DevKit for WorkManager workers.

A WorkManager Python worker is a module defining ``process(event)``. This
package adds, on top of that contract:

* CloudEvent helpers (:func:`new_event`, :func:`with_correlation_id`);
* worker base classes usable directly as ``process`` (:class:`WorkerBase`,
  :class:`CommandWorker`, :class:`ApiWorker`, :class:`ApiCommandWorker`);
* gateway calls through the node (:class:`ApiClient`);
* a version check for workers (:func:`require`).

The local harness (``python -m virtufin_worker run``,
:mod:`virtufin_worker.harness`), the pytest fixture
(:mod:`virtufin_worker.testing`) and the templates
(``python -m virtufin_worker new``) are separate modules: a worker loading
this package inside the node's runner imports none of them.
"""

__version__ = "0.1.0"

from .api import ApiCommandWorker, ApiWorker
from .commands import CommandWorker
from .events import CloudEvent, Output, new_event, with_correlation_id
from .gateway import ApiClient, Gateway, GatewayError
from .version import DevKitVersionError, require
from .worker import ProcessResult, WorkerBase

__all__ = [
    "__version__",
    "ApiClient",
    "ApiCommandWorker",
    "ApiWorker",
    "CloudEvent",
    "CommandWorker",
    "DevKitVersionError",
    "Gateway",
    "GatewayError",
    "Output",
    "ProcessResult",
    "WorkerBase",
    "new_event",
    "require",
    "with_correlation_id",
]
