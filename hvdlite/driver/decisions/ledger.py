"""The commit ledger: the newest commit of the job's training and where it lives now.

A commit lives in the memory of the live workers that hold it (one of them maybe a leaver
waiting to hand it over) and, with --checkpoint-dir, on disk once rank 0's writer said it
renamed the file there (or the folder held it when the job started). Every sentence that
names a commit to go on from, to stop at or to resume from, or says the state is gone, reads
it here; so does the rule that no world starts older than a commit still reachable.
"""


class Ledger:
    def __init__(self, on_disk: int = 0):
        self.newest = on_disk  # the newest commit any incarnation held since the last world formed
        self.disk = on_disk  # the newest commit known to be in --checkpoint-dir

    def held(self, commit: int) -> None:
        """A worker said it holds `commit` (in memory, or readable from disk)."""
        self.newest = max(self.newest, commit)

    def written(self, commit: int) -> None:
        """Rank 0's writer renamed `commit` into --checkpoint-dir."""
        self.disk = max(self.disk, commit)
        self.held(commit)

    def start(self, commit: int) -> int:
        """What a world whose best member holds `commit` goes on from: that, or the disk's
        newest when newer (its root loads the disk before the first sync)."""
        return max(commit, self.disk)

    def went_on_from(self, commit: int) -> None:
        """A world formed from `commit`: the training goes on from there, and anything newer
        was said lost (commit_lost) before it formed."""
        self.newest = commit

    def safe_without(self, commit: int, others) -> bool:
        """Whether `commit` stays reachable without its holder: on disk, or held by one of
        `others` (the commits of the live workers that stay)."""
        return commit <= max([self.disk, *others])
