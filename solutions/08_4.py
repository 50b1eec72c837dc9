"""Notebook 08, exercise 4: the bytes rank 0 of 3 holds under ZeRO-2, predicted by hand, then measured on 3 ranks."""

from dp_helpers.course.checkers.script_check import check_memory_prediction

numel = (10 * 64 + 64) + 64 * 64 + (64 + 1)  # first layer with bias, the second without, the output layer: 4,865
chunk = -(-numel // 3)  # 1,622 values per rank: the flat buffer is padded to 4,866
prediction = {"parameters": 4 * 3 * chunk,  # every rank keeps all the parameters, in the padded flat buffer
              "gradients": 4 * chunk,  # ZeRO-2: only its own chunk of the averaged gradient
              "optimizer state": 8 * chunk + 4}  # Adam's two moments for its chunk, and one step counter
assert check_memory_prediction(prediction)
