"""The GPU model table: the one mapping from NVML's names and PCI IDs to tessera model IDs."""

from __future__ import annotations

import re

import pytest

from tessera.models import MODELS, UnknownModelError, get_model, model_for_nvml, model_ids


def test_model_ids_are_unique_and_label_safe() -> None:
    ids = model_ids()
    assert len(ids) == len(set(ids))
    # Node label values: at most 63 chars of [A-Za-z0-9._-], alphanumeric at both ends.
    label_value = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")
    for model_id in ids:
        assert label_value.match(model_id), model_id


def test_every_nvml_name_and_pci_id_identifies_exactly_one_model() -> None:
    names = [n for m in MODELS for n in m.nvml_names]
    pci_ids = [p for m in MODELS for p in m.pci_device_ids]
    assert len(names) == len(set(names))
    assert len(pci_ids) == len(set(pci_ids))
    for model in MODELS:
        for name in model.nvml_names:
            assert model_for_nvml(name=name) is model
        for pci in model.pci_device_ids:
            assert pci & 0xFFFF == 0x10DE, "NVIDIA vendor ID in the low 16 bits"
            assert model_for_nvml(pci_device_id=pci) is model


def test_pci_id_wins_over_a_misleading_name() -> None:
    a30 = get_model("A30-24GB")
    assert model_for_nvml(name="NVIDIA H200", pci_device_id=a30.pci_device_id) is a30


def test_unknown_device_is_none_not_a_guess() -> None:
    assert model_for_nvml(name="NVIDIA GeForce RTX 4090", pci_device_id=0x268410DE) is None


def test_unknown_model_error_lists_known_models() -> None:
    with pytest.raises(UnknownModelError) as exc:
        get_model("H100")
    message = str(exc.value)
    assert "'H100'" in message
    assert "H100-80GB" in message and "A30-24GB" in message
