"""Leaf package: model files, formats and quantization. Imports nothing from core/app/ui and never Qt."""
