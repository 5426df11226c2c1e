"""The model card as CHAI's Applied Model Card XML (schema v0.2, `https://mc.chai.org/v0.2/
schema.xsd`): the `card` tree of `medtpe.model_card.card.build_model_card`, whose keys are the
schema's element names in its order (a mapping: child elements; a list: the element repeated;
text: the element's text, which the schema allows as Markdown)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from xml.etree import ElementTree

from medtpe.model_card.card import CHAI_NAMESPACE

ROOT = "AppliedModelCard"


def _fill(parent: ElementTree.Element, name: str, value: Any) -> None:
    if value is None:
        return
    if isinstance(value, list):
        for item in value:
            _fill(parent, name, item)
        return
    element = ElementTree.SubElement(parent, f"{{{CHAI_NAMESPACE}}}{name}")
    if isinstance(value, Mapping):
        for child, content in value.items():
            _fill(element, child, content)
    else:
        element.text = str(value)


def model_card_xml(card: Mapping[str, Any]) -> bytes:
    """The card (`build_model_card`'s result) as an Applied Model Card XML document (UTF-8)."""
    ElementTree.register_namespace("", CHAI_NAMESPACE)
    root = ElementTree.Element(f"{{{CHAI_NAMESPACE}}}{ROOT}")
    for name, value in card["card"].items():
        _fill(root, name, value)
    ElementTree.indent(root)
    return ElementTree.tostring(root, encoding="utf-8", xml_declaration=True) + b"\n"
