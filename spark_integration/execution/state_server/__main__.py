"""``python -m spark_integration.execution.state_server NAME PID``: a state server
process (see :func:`~spark_integration.execution.state_server.server.main`)."""

import sys

from spark_integration.execution.state_server.server import main

sys.exit(main())
