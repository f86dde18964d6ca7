"""`sluice dispatcher serve` states some of ServerSettings' defaults itself (the CLI imports no dispatcher code
until it runs): they must be the same."""
import inspect

from dispatcher.server import ServerSettings
from sluice.cli.servers import dispatcher_serve


def test_dispatcher_serve_defaults_are_server_settings_defaults():
    options = inspect.signature(dispatcher_serve).parameters
    for option, field in (("watch_streams", "watch_streams"), ("watch_streams_per_user", "watch_streams_per_user"),
                          ("agent_admissions", "agent_admissions_per_s"), ("heartbeat_s", "heartbeat_s")):
        assert options[option].default.default == getattr(ServerSettings, field), option
