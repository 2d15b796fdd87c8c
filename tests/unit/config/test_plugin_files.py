"""``trainer.plugins`` files run in this process: an edited file runs again and its components replace the ones its
earlier text registered; another file taking a registered name is refused, naming the key and the file."""

from __future__ import annotations

import uuid

import pytest

from hybridrl.agents.environment import ENVIRONMENTS
from hybridrl.config.errors import ConfigError
from hybridrl.config.plugins import load_plugins

PLUGIN = '''
from hybridrl.agents.environment import ENVIRONMENTS, Environment

@ENVIRONMENTS.register({name!r})
class Edited(Environment):
    VERSION = {version}
'''


def test_an_edited_plugin_runs_again_and_replaces_what_it_registered(tmp_path):
    name = f"edited_{uuid.uuid4().hex[:8]}"  # this process's registry outlives the test
    plugin = tmp_path / "plugin.py"
    plugin.write_text(PLUGIN.format(name=name, version=1))
    load_plugins([str(plugin)])
    first = ENVIRONMENTS[name]
    load_plugins([str(plugin)])                       # unchanged: not run again
    assert ENVIRONMENTS[name] is first and first.VERSION == 1
    plugin.write_text(PLUGIN.format(name=name, version=2))  # at once: the same mtime tick is likely
    load_plugins([str(plugin)])
    assert ENVIRONMENTS[name].VERSION == 2


def test_another_file_taking_a_registered_name_is_refused_by_name(tmp_path):
    name = f"taken_{uuid.uuid4().hex[:8]}"
    (tmp_path / "a.py").write_text(PLUGIN.format(name=name, version=1))
    (tmp_path / "b.py").write_text(PLUGIN.format(name=name, version=2))
    load_plugins([str(tmp_path / "a.py")])
    with pytest.raises(ConfigError, match=rf"trainer.plugins='.*b\.py'.*environment '{name}' is already registered"):
        load_plugins([str(tmp_path / "b.py")])
    assert ENVIRONMENTS[name].VERSION == 1

