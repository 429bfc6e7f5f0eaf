"""The shared import hook: callbacks after import, aliases, and the one-lookup fast path (fresh interpreters)."""

import subprocess
import sys
import textwrap


def run(tmp_path, code):
    (tmp_path / "newpkg").mkdir()
    (tmp_path / "newpkg" / "__init__.py").write_text("LOADS = []\nLOADS.append('newpkg')\n")
    (tmp_path / "newpkg" / "sub.py").write_text("import newpkg\nnewpkg.LOADS.append('sub')\n")
    (tmp_path / "main.py").write_text(textwrap.dedent(code))
    result = subprocess.run(
        [sys.executable, "main.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_alias_gives_the_target_module_objects_loaded_once(tmp_path):
    out = run(
        tmp_path,
        """\
        import sys
        from lightning_mpi_env.imports.hooks import alias_modules
        alias_modules({"oldpkg": "newpkg", "oldpkg.sub": "newpkg.sub"})
        assert "newpkg" not in sys.modules  # nothing imported until asked
        import oldpkg.sub
        from oldpkg import sub
        import newpkg, newpkg.sub
        assert oldpkg is newpkg and sub is newpkg.sub and oldpkg.sub is newpkg.sub
        assert newpkg.__spec__.name == "newpkg" and newpkg.sub.__spec__.name == "newpkg.sub"
        assert newpkg.__name__ == "newpkg"
        print(newpkg.LOADS)
        """,
    )
    assert out.strip() == "['newpkg', 'sub']"


def test_alias_of_an_imported_target_is_immediate(tmp_path):
    out = run(
        tmp_path,
        """\
        import sys, newpkg
        from lightning_mpi_env.imports.hooks import alias_modules
        alias_modules({"oldpkg": "newpkg"})
        print(sys.modules["oldpkg"] is newpkg)
        """,
    )
    assert out.strip() == "True"


def test_callback_runs_after_import_with_the_importer_on_the_stack(tmp_path):
    out = run(
        tmp_path,
        """\
        import sys
        from lightning_mpi_env.imports.hooks import _PostImportFinder, when_imported

        def seen(module):
            frame = sys._getframe(1)
            while frame.f_globals.get("__name__") != "__main__":
                frame = frame.f_back
            print(module.__name__, sys.modules["newpkg"].LOADS, frame.f_lineno)

        when_imported("newpkg.sub", seen)
        finder = next(f for f in sys.meta_path if isinstance(f, _PostImportFinder))
        assert finder.find_spec("json", None) is None  # unwatched: the fast path
        import newpkg.sub
        when_imported("newpkg.sub", seen)  # already imported: called at once
        """,
    )
    assert out.splitlines() == ["newpkg.sub ['newpkg', 'sub'] 13", "newpkg.sub ['newpkg', 'sub'] 14"]
