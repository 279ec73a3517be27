"""Attaching residency sets to a consumer command queue (Metal only)."""

from __future__ import annotations

import pytest

import hf2q


@pytest.fixture
def dev() -> hf2q.Device:
    return hf2q.Device._isolated("host")


def test_attach_command_queue_on_host_is_refused(dev):
    with pytest.raises(hf2q.DeviceError, match="no command queues"):
        dev.attach_command_queue(0x1000)
    with pytest.raises(ValueError, match="null"):
        dev.attach_command_queue(0)
    with pytest.raises(TypeError):
        dev.attach_command_queue("queue")
