"""Remote workers over SSH (paramiko): host configuration, connections, remote processes."""
from hvdlite.driver.launchers.ssh.config import SSHError, SSHSettings, host_config  # noqa: F401
from hvdlite.driver.launchers.ssh.connection import SSHHost  # noqa: F401
from hvdlite.driver.launchers.ssh.remote import LOST, RemoteWorker, launch  # noqa: F401
