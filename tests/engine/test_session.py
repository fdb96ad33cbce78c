"""fedsim/engine/session.py: how a failure once the run is under way reaches the user."""
import pytest
from ray.exceptions import RayTaskError

from fedsim.engine.session import _failures_explained
from fedsim.errors import ConfigError, DataError


class Folder:
    location = "runs/r"
    resume_command = "fedsim run --resume runs/r"


@pytest.mark.parametrize("error", [ConfigError("engine.spill_dir: cannot keep per-client state in /x"),
                                   DataError("data.root: cannot read /x")])
def test_bad_input_found_in_an_actor_is_its_one_line_with_the_folder_and_the_resume_command(error):
    """Ray's wrapper subclasses the error's class, so it is caught as one, and its text is the actor's traceback."""
    wrapped = RayTaskError("Worker.train", "Traceback (most recent call last):\n  ...\n", error).as_instanceof_cause()
    with pytest.raises(type(error)) as caught:
        with _failures_explained(Folder()):
            raise wrapped
    assert type(caught.value) is type(error)
    assert str(caught.value) == (f"{error} (found once the run had started, in its folder runs/r: fix it, then "
                                 "`fedsim run --resume runs/r`)")


def test_bad_input_raised_here_is_left_as_it_is():
    error = ConfigError("train.rounds: the run's checkpoint is at round 3")
    with pytest.raises(ConfigError) as caught:
        with _failures_explained(Folder()):
            raise error
    assert caught.value is error
