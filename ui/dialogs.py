"""Small dialogs behind `ask()` classmethods, so tests can replace them."""
from __future__ import annotations

from PySide6.QtWidgets import QFileDialog, QInputDialog, QMessageBox


class RenameDialog:
    @classmethod
    def ask(cls, parent, current: str) -> str | None:
        text, ok = QInputDialog.getText(parent, "Rename chat", "Title:", text=current)
        return text if ok and text.strip() else None


class ExportDialog:
    @classmethod
    def ask(cls, parent, suggested: str, fmt: str) -> str | None:
        filt = "Markdown (*.md)" if fmt == "md" else "JSON (*.json)"
        path, _ = QFileDialog.getSaveFileName(parent, "Export chat", suggested, filt)
        return path or None


class EditDialog:
    @classmethod
    def ask(cls, parent, current: str) -> str | None:
        text, ok = QInputDialog.getMultiLineText(parent, "Edit and resend", "Message:", current)
        return text if ok and text.strip() else None


def show_info(parent, title: str, text: str) -> None:
    QMessageBox.information(parent, title, text)


class ConfirmDialog:
    @classmethod
    def ask(cls, parent, title: str, text: str) -> bool:
        answer = QMessageBox.question(parent, title, text)
        return answer == QMessageBox.StandardButton.Yes


class GgufFileDialog:
    @classmethod
    def ask(cls, parent) -> str | None:
        path, _ = QFileDialog.getOpenFileName(parent, "Import a GGUF model", "", "GGUF models (*.gguf)")
        return path or None


class HfFolderDialog:
    @classmethod
    def ask(cls, parent) -> str | None:
        return QFileDialog.getExistingDirectory(parent, "Import a Hugging Face model folder") or None


class RepoDialog:
    @classmethod
    def ask(cls, parent) -> str | None:
        text, ok = QInputDialog.getText(parent, "Download from the Hugging Face hub",
                                        "Repository (owner/name, Qwen2.5 safetensors):", text="Qwen/Qwen2.5-0.5B-Instruct")
        return text.strip() if ok and text.strip() else None
