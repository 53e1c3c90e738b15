"""The data: sources (digits, synthetic, image folders, TFRecords), each worker's slice of the
global batch, decoding, augmentation, and what the input costs."""
