"""optimum-quanto: every submodule (some are imported by name at run time) and its version metadata."""
from PyInstaller.utils.hooks import collect_data_files, collect_submodules, copy_metadata

hiddenimports = collect_submodules("optimum.quanto", filter=lambda name: ".extensions.cuda" not in name
                                   and ".extensions.mps" not in name and ".extensions.xpu" not in name
                                   and ".subpackage" not in name)
datas = copy_metadata("optimum-quanto") + collect_data_files("optimum.quanto", excludes=["**/*.cu", "**/*.cuh",
                                                                                        "**/*.mm", "**/*.metal"])
