"""The Keras binding: which Keras trains (`binding`), what each binding provides (`contract`),
and one module per Keras (`v3`: Keras 3; `v2`: Keras 2), as Keras has one `backend/<name>/` per
backend."""
