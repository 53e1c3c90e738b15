"""`hvd-train predict`: each image's predicted class and probability, in a CSV."""

from __future__ import annotations

from hvd_train.commands.environment import setup_environment
from hvd_train.commands.evaluate import parser
from hvd_train.config import load_config
from hvd_train.train.inference.files import refuse_foreign_csv  # no TensorFlow


def main(argv: list[str], prog: str) -> int:
    """`hvd-train predict`: one CSV row per image of a folder, the predicted class and its
    probability."""
    p = parser(
        prog,
        "Predict the class of every JPEG/PNG image under a folder (searched recursively; "
        "class sub-folders allowed, not needed), sharded across workers, each image once. "
        "Rank 0 writes a CSV sorted by path: path (relative to --images), class, class_index, "
        "probability.",
    )
    p.add_argument("--images", required=True, metavar="FOLDER", help="the images")
    p.add_argument(
        "--out", required=True, metavar="FILE",
        help="CSV to write; an existing file is written over only if predict wrote it",
    )  # fmt: skip
    args = p.parse_args(argv)
    cfg = load_config(args.config, args.overrides)
    setup_environment(cfg, command="hvd-train predict", check=lambda: refuse_foreign_csv(args.out))
    from hvd_train.train.inference.predict import predict  # TensorFlow's side, loaded now

    predict(cfg, args.model, args.images, args.out, args.batch_size or cfg.train.batch_size)
    return 0
