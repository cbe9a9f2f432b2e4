"""pip install . : libtpdraft.so and the Python package tpdraft, built by CMake and installed
with the library inside the package (the extension finds it beside itself). CMAKE_ARGS adds
CMake options (e.g. -DTPDRAFT_CUDA=OFF); CMAKE_BUILD_PARALLEL_LEVEL sets the build's jobs."""

import os
import re
import shlex
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))


def version():
    with open(os.path.join(HERE, "include", "tpdraft", "tpdraft.h")) as f:
        return re.search(r'#define TPDRAFT_VERSION_STRING "([0-9.]+)"', f.read()).group(1)


class CMakeBuild(build_ext):
    """Configures a build folder of its own for this interpreter, builds the module's target only
    and installs its component (the package, the extension and the library) into the wheel."""

    def build_extension(self, ext):
        build = os.path.abspath(os.path.join(self.build_temp, "cmake"))
        stage = os.path.abspath(os.path.join(self.build_temp, "stage"))
        package = os.path.dirname(os.path.abspath(self.get_ext_fullpath(ext.name)))
        cmake = os.environ.get("CMAKE", "cmake")
        subprocess.run([cmake, "-S", HERE, "-B", build, "-DCMAKE_BUILD_TYPE=Release", "-DTPDRAFT_BUILD_TESTS=OFF",
                        f"-DTPDRAFT_PYTHON3={sys.executable}", "-DTPDRAFT_PYTHON_SITE_DIR=site",
                        "-DTPDRAFT_PYTHON_BUNDLE_LIBRARY=ON"] + shlex.split(os.environ.get("CMAKE_ARGS", "")),
                       check=True)
        subprocess.run([cmake, "--build", build, "--target", "tpdraft_python"], check=True)
        shutil.rmtree(stage, ignore_errors=True)
        subprocess.run([cmake, "--install", build, "--component", "python", "--prefix", stage], check=True)
        shutil.copytree(os.path.join(stage, "site", "tpdraft"), package, dirs_exist_ok=True)


setup(
    version=version(),
    packages=["tpdraft"],
    package_dir={"": "python"},
    package_data={"tpdraft": ["*.pyi", "py.typed"]},
    ext_modules=[Extension("tpdraft._core", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    # setuptools' default, build/, is the project's own build folder.
    options={"build": {"build_base": "build-pip"}},
    zip_safe=False,
)
