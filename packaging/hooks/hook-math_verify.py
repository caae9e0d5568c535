"""math-verify and its LaTeX parser: the ANTLR grammar modules are picked by version at run time."""
from PyInstaller.utils.hooks import collect_submodules, copy_metadata

hiddenimports = collect_submodules("math_verify") + collect_submodules("latex2sympy2_extended")
datas = copy_metadata("math-verify") + copy_metadata("latex2sympy2_extended") + copy_metadata("antlr4-python3-runtime")
