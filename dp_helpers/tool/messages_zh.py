"""Simplified-Chinese translations of the checker messages, keyed by their English template (see i18n.tr).

Each value keeps its template's placeholders (tests/test_i18n.py checks them); a placeholder filled with another
template (a `what`, `case`, `where`, `hint`, `problem`, `logs`...) receives that template's translation.
"""

MESSAGES: dict[str, str] = {
    "there is no solution {key!r}; the exercises with one are {known}":
        "没有名为 {key!r} 的参考答案；有参考答案的练习是：{known}",
    "correct: {message}": "正确：{message}",
    "there is no question {key!r}; the ones of this notebook are: {known}":
        "没有名为 {key!r} 的题目；本笔记本的题目有：{known}",
    "{path} is a folder: give the path of your .py file.": "{path} 是一个文件夹：请给出你的 .py 文件的路径。",
    "{path} is not UTF-8 text: save it as a Python file in UTF-8.": "{path} 不是 UTF-8 文本：请把它存成 UTF-8 编码的 Python 文件。",
    "stage must be 1, 2 or 3 (the ZeRO stages), not {stage!r}.": "stage 必须是 1、2 或 3（ZeRO 的三个阶段），而不是 {stage!r}。",
    "{name} must be a whole number from {low} to {high}, not {value!r}.":
        "{name} 必须是 {low} 到 {high} 之间的整数，而不是 {value!r}。",
    "not yet: {message}": "还不对：{message}",
    "replace the ... with your answer and run the cell again.": "把 ... 换成你的答案，再运行这个单元格。",
    "that is what this notebook's rules give.": "按本笔记本的规则，结果正是如此。",
    "{problem}; {hint}.": "{problem}；{hint}。",
    "recheck the rule in this notebook and try again": "请对照本笔记本中的规则再试一次",
    "4 is the number of processes: one device must take in one step every sample the 4 processes take together":
        "4 是进程数：一个设备要在一步之内处理这 4 个进程加起来的全部样本",
    "8 is one process's batch: one device must take all 4 processes' samples in one step":
        "8 是单个进程的批次大小：一个设备要在一步之内处理全部 4 个进程的样本",
    ("that counts device 0 too, which holds the model already: only the copies sent to the other devices are "
     "replicated"):
        "这把设备 0 也算进去了，而它本来就持有模型：只有发往其他设备的副本才算复制",
    "MiB where MB (10^6 bytes) are asked": "题目要的是 MB（10^6 字节），你用的却是 MiB",
    "MB where MiB (2^20 bytes) are asked": "题目要的是 MiB（2^20 字节），你用的却是 MB",
    "GiB where GB (10^9 bytes) are asked": "题目要的是 GB（10^9 字节），你用的却是 GiB",
    "GB where GiB (2^30 bytes) are asked": "题目要的是 GiB（2^30 字节），你用的却是 GB",
    "a unit 1000 times smaller than the one asked (kB for MB?)":
        "你用的单位比题目要的小 1000 倍（把 MB 写成了 kB？）",
    "a unit 1000 times larger than the one asked (GB for MB?)": "你用的单位比题目要的大 1000 倍（把 MB 写成了 GB？）",
    "bytes where MB are asked": "题目要的是 MB，你给的却是字节数",
    "bytes where GB are asked": "题目要的是 GB，你给的却是字节数",
    "bits where bytes are asked": "题目要的是字节数，你给的却是比特数",
    "bytes where bits are asked": "题目要的是比特数，你给的却是字节数",
    "your answer": "你的答案",
    "{what} is {got!r}": "{what}是 {got!r}",
    "{what} is {got!r}; True or False is asked": "{what}是 {got!r}，但这里要的是 True 或 False",
    "{what} is {got!r}; a word is asked": "{what}是 {got!r}，但这里要的是一个词",
    "{what} is {got!r}; one number is asked": "{what}是 {got!r}，但这里要的是一个数",
    "{what} is {got!r}: that looks like {slip}": "{what}是 {got!r}：看起来单位弄错了，{slip}",
    "{what} is {got!r}; a list of {n} values is asked": "{what}是 {got!r}，但这里要的是包含 {n} 个值的列表",
    "{what} has {n} values; {asked} are asked": "{what}有 {n} 个值，但这里要的是 {asked} 个",
    "the value at index {i} of {what}": "{what}中下标为 {i} 的值",
    "on {world_size} ranks your ring_all_gather returned without waiting for its messages: dist.isend and dist.irecv only start a transfer; call .wait() on each handle they return before you read the piece received or send it on {logs}.":
        "在 {world_size} 个 rank 上，你的 ring_all_gather 没有等消息到达就返回了：dist.isend 和 dist.irecv 只是启动一次传输；在读取收到的那一块、或把它继续发出去之前，要对它们返回的每个句柄调用 .wait() {logs}。",
    "{what} is {got!r}: close, but give at least 3 significant digits": "{what}是 {got!r}：很接近，但请至少给出 3 位有效数字",
    "for {case}: {slip}.": "对于 {case}：{slip}。",
    "your function gives P (M^T P)^T with P = M Q as it is: orthonormalise P's columns (compression.orthogonalize, or torch.linalg.qr) before Q = M^T P":
        "你的函数直接用 P = M Q 算出了 P (M^T P)^T：在计算 Q = M^T P 之前，先把 P 的各列正交归一化（compression.orthogonalize 或 torch.linalg.qr）",
    "{what} is {got!r}; a dict with the keys {keys} is asked": "{what}是 {got!r}，但这里要的是以 {keys} 为键的 dict",
    "{what} has the keys {given}; the keys {keys} are asked": "{what}的键是 {given}，但这里要的键是 {keys}",
    "your function still raises NotImplementedError: write its body.":
        "你的函数仍然抛出 NotImplementedError：请写出函数体。",
    "for {case} your function raised {error}: {exc}.": "对于 {case}，你的函数抛出了 {error}：{exc}。",
    "your function returned {got!r} for {case}: write its body.":
        "对于 {case}，你的函数返回了 {got!r}：请写出函数体。",
    "for {case} expected {want!r}, got {got!r}.": "对于 {case}，应得到 {want!r}，实际得到 {got!r}。",
    "{n} cases agree with the reference.": "{n} 个用例都与参考实现一致。",
    "your function calls {name}: the exercise asks for slicing only (batch[i:j]).":
        "你的函数调用了 {name}：这道练习只允许用切片（batch[i:j]）。",
    "a batch of {rows} rows on {n} devices": "{rows} 行的批次、{n} 个设备",
    "with {k} micro-batches, forwards inside no_sync were {forwards}; expected all but the last.":
        "有 {k} 个微批次时，各次前向传播是否在 no_sync 内依次为 {forwards}；应当除最后一次外都在 no_sync 内。",
    "the gradients of the previous step were still there: call optimizer.zero_grad() first.":
        "上一步的梯度还留着：先调用 optimizer.zero_grad()。",
    ("with micro-batches of {sizes} samples the weights differ from one step on the whole batch: weight each loss "
     "by its share of the samples (len(inputs) / total), not by 1/k."):
        ("微批次的样本数为 {sizes} 时，权重与在整个批次上走一步的结果不同："
         "每个损失要按它所占的样本比例（len(inputs) / total）加权，而不是乘以 1/k。"),
    ("with one micro-batch (the whole batch) the weights differ from one step of train_step: the mean BCE loss on "
     "model(inputs) and targets.unsqueeze(1), one backward, one optimizer.step()."):
        ("只有一个微批次（即整个批次）时，权重与 train_step 走一步的结果不同："
         "应当在 model(inputs) 和 targets.unsqueeze(1) 上求平均 BCE 损失，做一次反向传播，调用一次 optimizer.step()。"),
    ("with {k} micro-batches the weights differ from one step on the whole batch: divide each loss by k, and step "
     "the optimizer once, after the last backward."):
        ("有 {k} 个微批次时，权重与在整个批次上走一步的结果不同：把每个损失除以 k，"
         "并且只在最后一次反向传播之后调用一次优化器的 step()。"),
    ("your function raised {error}: {exc}: use the no_sync argument, `with no_sync():` (the checker's model is a "
     "plain module; under DDP you would pass model.no_sync)."):
        ("你的函数抛出了 {error}：{exc}：请使用参数 no_sync，写成 `with no_sync():`（检查器用的模型是普通模块；"
         "在 DDP 下你会传入 model.no_sync）。"),
    "your function raised {error}: {exc}: call it, `with no_sync():`, as you would write `with model.no_sync():`.":
        "你的函数抛出了 {error}：{exc}：要调用它，写成 `with no_sync():`，就像你平时写 `with model.no_sync():` 一样。",
    "your function raised {error}: {exc}.": "你的函数抛出了 {error}：{exc}。",
    ("one optimizer step equal to the large batch, with equal and unequal micro-batches, and only the last "
     "backward synchronises."):
        "无论微批次大小相等还是不等，一次优化器更新都与在大批次上走一步相同，而且只有最后一次反向传播做了同步。",
    "with {samples} samples on {world_size} ranks": "{samples} 个样本分到 {world_size} 个 rank 上时",
    "{case} your function raised {error}: {exc}.": "{case}，你的函数抛出了 {error}：{exc}。",
    ("{case} the ranks did not all call all_reduce the same number of times (one waited for the others): every "
     "rank calls every collective, even a rank with no samples."):
        ("{case}，各 rank 调用 all_reduce 的次数不一样（有一个 rank 一直在等其他 rank）："
         "每个 rank 都要参与每一次集合通信，没有样本的 rank 也一样。"),
    ("{case} samples {twice} were scored more than once (padding, as DistributedSampler does?): give rank r the "
     "samples r, r + W, r + 2W, ... and no more."):
        ("{case}，样本 {twice} 被评估了不止一次（是不是像 DistributedSampler 那样做了填充？）："
         "rank r 只应处理样本 r, r + W, r + 2W, ...，不能再多。"),
    "{case} samples {missing} were never scored: together the ranks must score every sample once.":
        "{case}，样本 {missing} 从未被评估：所有 rank 合起来必须把每个样本恰好评估一次。",
    "{case} rank {rank} returned {value!r}, the mean over all samples is {want:.6f}: {why}.":
        "{case}，rank {rank} 返回了 {value!r}，而全部样本的平均值是 {want:.6f}：{why}。",
    "all-reduce the sums and the counts, then divide once": "先对总和与计数做全归约，再只除一次",
    "it is this rank's own mean: all-reduce the sum and the count, then divide":
        "这是本 rank 自己的平均值：先对总和与计数做全归约，再相除",
    "it is the all-reduced sum divided by this rank's own count: all-reduce the count too":
        "这是全归约后的总和除以本 rank 自己的计数：计数也要做全归约",
    ("it is the mean of the per-rank means, which weighs a short shard like a full one: all-reduce the sums and the "
     "counts, then divide once"):
        "这是各 rank 平均值的平均值，它把较短的分片和完整的分片同等对待：先对总和与计数做全归约，再只除一次",
    ("it is the sum divided by world_size times this rank's count, as if every shard were as long: all-reduce the "
     "counts instead"):
        "这是总和除以 world_size 乘本 rank 的计数，仿佛每个分片都一样长：应当对计数做全归约",
    "it is the all-reduced sum, never divided: divide it by the all-reduced count":
        "这是全归约后的总和，还没有除：要除以全归约后的计数",
    ("{case} every rank scored every sample ({world_size} times each): give rank r only the samples r, r + W, "
     "r + 2W, ..."):
        "{case}，每个 rank 都评估了全部样本（每个样本 {world_size} 次）：rank r 只应处理样本 r, r + W, r + 2W, ...",
    "every sample scored once, on 1 to 4 ranks with even and uneven shards, and every rank returns the exact mean.":
        "在 1 到 4 个 rank 上，无论分片均匀与否，每个样本都恰好评估一次，而且每个 rank 都返回了精确的平均值。",
    "after fn(state, {name!r}) there is no file {name!r}: save the state at that path.":
        "调用 fn(state, {name!r}) 之后没有文件 {name!r}：请把 state 保存到这个路径。",
    "the saved file does not load back as the state you were given: save the whole dict.":
        "保存的文件加载回来后与传入的 state 不一致：请保存整个 dict。",
    ("a save that failed halfway destroyed the previous snapshot: write to a temporary file in the same folder, "
     "then os.replace() it onto the path (a rename is all or nothing)."):
        ("中途失败的保存毁掉了上一个快照：先写到同一文件夹里的临时文件，"
         "再用 os.replace() 把它换到目标路径上（重命名要么完全成功，要么什么都不改变）。"),
    ("the temporary file is in another folder: os.replace() is atomic only within one file system, so put it "
     "beside the checkpoint."):
        "临时文件在另一个文件夹里：os.replace() 只在同一个文件系统内是原子操作，所以要把临时文件放在检查点旁边。",
    "when torch.save failed your function returned as if it had saved: let the OSError propagate.":
        "torch.save 失败时，你的函数却像保存成功一样正常返回了：让 OSError 继续向上抛出。",
    "a failed save left {left} behind: remove the temporary file when the write fails, then re-raise.":
        "失败的保存留下了 {left}：写入失败时先删除临时文件，再重新抛出异常。",
    "the snapshot loads back, and a save that failed halfway left the previous one whole and nothing else behind.":
        "快照可以加载回来；中途失败的保存既保住了完整的上一个快照，也没有留下其他文件。",
    "the one-device loop": "单设备训练循环",
    "turn it into DDP": "把它改成 DDP 脚本",
    "{path}: {what}, ready to edit. Open it in the editor, {task}, then run {checker}({path!r}).":
        "{path}：{what}，可以编辑了。在编辑器中打开它，{task}，然后运行 {checker}({path!r})。",
    "{path}: your file, kept. Open it in the editor, {task}, then run {checker}({path!r}).":
        "{path}：这是你的文件，已保留。在编辑器中打开它，{task}，然后运行 {checker}({path!r})。",
    "dist.all_reduce returns a work handle only with async_op=True (without it, it blocks and returns None)":
        "dist.all_reduce 只有在 async_op=True 时才返回 work 句柄（不加它就会阻塞，并返回 None）",
    "`param in a_list` compares tensors by value; use a set, or compare ids":
        "`param in a_list` 会按值比较张量；请改用 set，或者比较 id",
    "{path}: {names} still raise NotImplementedError, as in the skeleton: write their bodies, then run this again.":
        "{path}：{names} 仍和骨架里一样抛出 NotImplementedError；写出它们的函数体，然后再运行一次。",
    "a method of the skeleton still raises NotImplementedError: write its body":
        "骨架中还有方法抛出 NotImplementedError：请写出它的方法体",
    "(every rank's output": "（所有 rank 的输出",
    "waited": "等待",
    "(every rank's output: {path})": "（所有 rank 的输出：{path}）",
    ("the process group never formed ({cause}): under torchrun call dist.init_process_group(backend) with no "
     "address, port or init_method; torchrun picks a free port and gives it to every rank {logs}."):
        ("进程组始终没有建立（{cause}）："
         "在 torchrun 下调用 dist.init_process_group(backend) 时不要传地址、端口或 init_method；"
         "torchrun 会把同一个空闲端口告诉每个 rank{logs}。"),
    ("{cause}: a DistributedSampler (or a group) built for another world size; leave num_replicas and rank out, "
     "they default to the process group's {logs}."):
        ("{cause}：DistributedSampler（或某个进程组）是按另一个进程总数构建的；不要传 num_replicas 和 rank，"
         "它们默认取进程组的值{logs}。"),
    ": {hint}": "：{hint}",
    "on {world_size} ranks, rank {rank} raised {cause}{line}{hint} {logs}.":
        "在 {world_size} 个 rank 上，rank {rank} 抛出了 {cause}{line}{hint}{logs}。",
    ("on {world_size} ranks your code ran past {timeout_s:g} s and was stopped: every rank kept waiting. A receive "
     "that no rank's send meets (a blocking recv before any send?), or a loop that never ends? {logs}."):
        ("在 {world_size} 个 rank 上，你的代码运行超过了 {timeout_s:g} 秒，被强行停止：每个 rank 都在一直等待。"
         "是不是有一个接收永远等不到对应的发送（在任何发送之前就阻塞在 recv 上？），或者有一个永远不会结束的循环？{logs}。"),
    ("rank(s) {left} finished while rank(s) {needing} still needed them: every rank must run every step, since "
     "DDP's backward is a collective, as is every all_reduce {logs}."):
        ("rank {left} 已经结束，而 rank {needing} 仍然需要它们：每个 rank 都必须跑完每一步，"
         "因为 DDP 的反向传播是一次集合通信，每次 all_reduce 也是{logs}。"),
    ("rank {rank} waited {timeout_s:g} s in a collective that rank(s) {others} never reached: a hang; is a rank "
     "stuck in a loop, or busy with work the others skip? {logs}"):
        ("rank {rank} 在一次集合通信中等待了 {timeout_s:g} 秒，而 rank {others} 始终没有执行到它：程序卡死了；"
         "是不是有个 rank 陷在循环里，或者在忙其他 rank 跳过的工作？{logs}"),
    "on {world_size} ranks your script failed: {cause} {logs}.":
        "在 {world_size} 个 rank 上，你的脚本失败了：{cause}{logs}。",
    ", in {file}, line {line}": "，位于 {file} 第 {line} 行",
    "rank {rank} called {name}": "rank {rank} 调用的是 {name}",
    ("rank {rank} called {name} (its collective number {number}) where {other}: every rank must make the same "
     "collectives in the same order."):
        ("rank {rank} 调用了 {name}（它的第 {number} 次集合通信），而 {other}："
         "每个 rank 都必须按相同的顺序调用相同的集合通信。"),
    ("rank {rank} called {name} (its collective number {number}), and rank(s) {missing} finished without calling "
     "it: is it inside `if rank == 0:`? Every rank must call it."):
        ("rank {rank} 调用了 {name}（它的第 {number} 次集合通信），而 rank {missing} 没有调用它就结束了："
         "它是不是写在了 `if rank == 0:` 里面？每个 rank 都必须调用它。"),
    ("rank {rank} waited in {name} (its collective number {number}) for rank(s) {missing}, which had not called "
     "it when the run failed: is it inside `if rank == 0:`, or is a rank stuck or slow?"):
        ("rank {rank} 在 {name}（它的第 {number} 次集合通信）中等待 rank {missing}，而运行失败时它们还没有调用它："
         "它是不是写在了 `if rank == 0:` 里面，或者有个 rank 卡住了、太慢了？"),
    "no process group: call dist.init_process_group() first; without it each process trains alone.":
        "没有进程组：先调用 dist.init_process_group()；否则各个进程只是各自单独训练。",
    "the model is never wrapped in DistributedDataParallel: nothing averages the gradients across ranks.":
        "模型始终没有用 DistributedDataParallel 包装：梯度不会在各 rank 之间求平均。",
    ("no DistributedSampler: every rank iterates all 960 samples; give the DataLoader "
     "sampler=DistributedSampler(dataset) so that each rank gets its own share."):
        ("没有 DistributedSampler：每个 rank 都遍历全部 960 个样本；"
         "给 DataLoader 传入 sampler=DistributedSampler(dataset)，让每个 rank 拿到自己的那一份。"),
    ("rank {rank}'s DistributedSampler has num_replicas={num_replicas}, rank={its_rank}; it needs {world_size} "
     "and {rank} (leave them out: they default to the process group's)."):
        ("rank {rank} 的 DistributedSampler 是 num_replicas={num_replicas}, rank={its_rank}；"
         "应为 {world_size} 和 {rank}（不传这两个参数即可：它们默认取进程组的值）。"),
    ("the DistributedSampler has shuffle={shuffle}, seed={seed}: the one-device loop shuffles with seed 0 + "
     "epoch, which is DistributedSampler's default (shuffle=True, seed=0)."):
        ("DistributedSampler 的参数是 shuffle={shuffle}, seed={seed}：单设备循环用随机种子 0 + epoch 打乱数据，"
         "这正是 DistributedSampler 的默认设置（shuffle=True, seed=0）。"),
    ("the sampler's epochs were {epochs}, not {expected}: call sampler.set_epoch(epoch) at the start of every "
     "epoch, or every epoch shuffles alike."):
        ("采样器的轮次依次是 {epochs}，而不是 {expected}：在每一轮开始时调用 sampler.set_epoch(epoch)，"
         "否则每一轮的打乱顺序都一样。"),
    "rank {rank} saved too: only rank 0 may write the file (put torch.save under `if rank == 0:`).":
        "rank {rank} 也保存了文件：只有 rank 0 可以写这个文件（把 torch.save 放到 `if rank == 0:` 下面）。",
    "nothing was saved at --out: rank 0 must torch.save the model's weights there.":
        "--out 指定的位置没有保存任何文件：rank 0 必须用 torch.save 把模型权重保存到那里。",
    "the saved names start with 'module.' (the DDP wrapper's): save model.module.state_dict().":
        "保存的参数名以 'module.' 开头（这是 DDP 包装器加上的前缀）：请保存 model.module.state_dict()。",
    "ranks {ranks} print the epoch loss: print on rank 0 only.":
        "rank {ranks} 都打印了每轮的损失：只应在 rank 0 上打印。",
    "rank 0 prints no 'epoch N loss X' line: keep the one-device loop's print, on rank 0.":
        "rank 0 没有打印 'epoch N loss X' 这样的行：保留单设备循环中的 print，放在 rank 0 上执行。",
    ("rank 0's DataLoader takes batches of {batches}, and the checker passed --batch-size {batch_size}: "
     "--batch-size is already the batch of one process, use it as it is."):
        ("rank 0 的 DataLoader 批次大小是 {batches}，而检查器传入的是 --batch-size {batch_size}："
         "--batch-size 已经是单个进程的批次大小，直接使用即可。"),
    ("the gradients come out {world_size}x too small: DDP already averages them over the ranks, so the loss must "
     "not be divided by world_size again."):
        "梯度小了 {world_size} 倍：DDP 已经在各 rank 之间对梯度求平均，所以损失不能再除以 world_size。",
    ("the steps come out {world_size}x too large: the gradients are summed over the ranks, or the learning rate "
     "is multiplied by world_size; DDP averages, and this exercise keeps the one-device learning rate (scaling it "
     "with the batch is a choice notebook 06 discusses, not part of DDP)."):
        ("每步的更新大了 {world_size} 倍：要么梯度在各 rank 之间被求和了，要么学习率乘了 world_size；DDP 求的是平均，"
         "而且这道练习沿用单设备的学习率（随批次放大学习率是笔记本 06 讨论的一种选择，不属于 DDP 本身）。"),
    ("on {world_size} ranks the weights differ from one device on the global batch of {batch} by up to {gap:.3g}: "
     "does every rank build the same dataset (seeded alike), call optimizer.zero_grad() every step, and keep the "
     "loop's model, loss and learning rate?"):
        ("在 {world_size} 个 rank 上，权重与单设备在 {batch} 个样本的全局批次上训练的结果最多相差 {gap:.3g}："
         "每个 rank 是否构建了相同的数据集（随机种子相同）、每一步都调用了 optimizer.zero_grad()，"
         "并且保留了循环原有的模型、损失和学习率？"),
    ("rank 0 printed {lines} lines like 'epoch N ... loss X', and the checker reads one per epoch ({epochs}): "
     "keep the one-device loop's print once an epoch; other lines must not contain both words."):
        ("rank 0 打印了 {lines} 行形如 'epoch N ... loss X' 的内容，而检查器每轮读一行（共 {epochs} 轮）："
         "保留单设备循环中每轮一次的 print；其他行不能同时包含这两个词。"),
    ("rank 0 printed losses {printed}, one device prints {expected}: all-reduce the sum of the losses and the "
     "number of samples before dividing (rank 0 alone saw only its share)."):
        ("rank 0 打印的损失是 {printed}，单设备打印的是 {expected}：先对损失之和与样本数做全归约，"
         "再相除（rank 0 自己只看到了它那一份数据）。"),
    "there is no {path} yet: run the cell above this one first.": "还没有 {path}：先运行上面那个单元格。",
    "{path} is still {untouched}: edit it, save it, run this again.":
        "{path} 仍是未经修改的原始文件（{untouched}）：修改它、保存，然后再运行一次。",
    "{path}, line {line}: {error}.": "{path} 第 {line} 行：{error}。",
    (" At home, free the DDP model before destroy_process_group() (del, gc.collect(): examples/train_ddp.py); the "
     "checker's runs skip the interpreter's exit, where gloo can otherwise abort."):
        ("在你自己的机器上，请在 destroy_process_group() 之前释放 DDP 模型（del、gc.collect()："
         "见 examples/train_ddp.py）；检查器的运行跳过了解释器的退出阶段，而 gloo 在那个阶段有可能中止。"),
    ("on 2 and 3 ranks your script ends with the weights and prints the losses of one device on the global batch "
     "of {batch}; rank 0 alone saved and printed.{tip}"):
        ("在 2 个和 3 个 rank 上，"
         "你的脚本最终得到的权重和打印的损失都与单设备在 {batch} 个样本的全局批次上的结果相同；"
         "只有 rank 0 保存和打印。{tip}"),
    "the MyDDP skeleton": "MyDDP 骨架",
    "write ready() and launch()": "写出 ready() 和 launch()",
    ("{where}, the buckets launched were {launched} of {expected}: launch(k) must run once per bucket, as soon as "
     "all of bucket k's gradients are ready (and those of the buckets before it)."):
        ("{where}，发起过的梯度桶是 {launched}，应为 {expected}：launch(k) 对每个梯度桶必须恰好运行一次，"
         "而且要在梯度桶 k 的所有梯度（以及它之前各梯度桶的梯度）都就绪时立即运行。"),
    ("{where}, the buckets were launched in the order {launched}: launch them by index, 0 first, a full bucket "
     "waiting for the ones before it; two ranks whose gradients arrive in another order would otherwise "
     "all-reduce different buckets together."):
        ("{where}，梯度桶的发起顺序是 {launched}：要按编号发起，从 0 开始，已装满的梯度桶要等它前面的梯度桶先发起；"
         "否则梯度到达顺序不同的两个 rank 会把不同的梯度桶放在一起做全归约。"),
    ("{where}, every all-reduce started after the last gradient was ready: launch a bucket inside ready(), as "
     "soon as it is full, so that it travels while the backward computes the rest."):
        ("{where}，所有全归约都是在最后一个梯度就绪之后才开始的：要在 ready() 里、梯度桶一装满就发起它，"
         "这样它在传输的同时，反向传播还在计算其余的梯度。"),
    ("{where}, an all-reduce was waited for while the backward still produced gradients: then the backward stalls "
     "on every bucket; wait only in finish(), once the backward is done."):
        ("{where}，反向传播还在产生梯度时就对一次全归约调用了 wait()：这样反向传播会在每个梯度桶上停顿；"
         "只在 finish() 里、反向传播结束之后再调用 wait()。"),
    "{where}, your gradients are {world_size}x DDP's: the all-reduce sums, so divide each bucket by the world size.":
        "{where}，你的梯度是 DDP 的 {world_size} 倍：全归约做的是求和，所以要把每个梯度桶除以进程总数。",
    "{where}, your gradients are 1/{world_size} of DDP's: they are divided by the world size twice.":
        "{where}，你的梯度只有 DDP 的 1/{world_size}：它们被除了两次进程总数。",
    "{where}, your gradients differ from DDP's by up to {gap:.3g}.": "{where}，你的梯度与 DDP 的最多相差 {gap:.3g}。",
    "on {world_size} ranks, {problem}": "在 {world_size} 个 rank 上，{problem}",
    "on rank {rank}, step {step}": "在 rank {rank} 的第 {step} 步",
    "on rank {rank} the weights end {gap:.3g} away from DDP's.":
        "在 rank {rank} 上，最终权重与 DDP 的相差 {gap:.3g}。",
    "on rank {rank}, with a model whose layers run in the reverse order of their registration":
        "在 rank {rank} 上，换成各层按注册顺序的逆序运行的模型时",
    "{problem} (one ready() may have to launch several buckets: a loop)":
        "{problem}（一次 ready() 可能要发起好几个梯度桶：需要一个循环）",
    ("on 2 ranks, {steps} steps: {buckets} buckets launched in order during the backward, gradients and weights "
     "equal to torch's DistributedDataParallel, also for a model whose layers run in the reverse order of their "
     "registration."):
        ("在 2 个 rank 上训练 {steps} 步：{buckets} 个梯度桶在反向传播期间按顺序发起，"
         "梯度和权重都与 torch 的 DistributedDataParallel 相同；换成各层按注册顺序的逆序运行的模型也是如此。"),
    "the MyZero1 skeleton": "MyZero1 骨架",
    "write step()": "写出 step()",
    ("step {step} all-reduced the whole gradient: then every rank holds all of it; reduce-scatter it, so that "
     "each rank receives only its chunk of {chunk} values."):
        ("第 {step} 步对整个梯度做了全归约：这样每个 rank 都持有全部梯度；应当做归约-散射，"
         "让每个 rank 只收到属于自己的那一块，共 {chunk} 个值。"),
    "step {step} called no collective: ZeRO-1 needs one reduce-scatter and one all-gather.":
        "第 {step} 步没有调用任何集合通信：ZeRO-1 每一步需要一次归约-散射和一次全收集。",
    "step {step} called {names}: ZeRO-1 needs one reduce-scatter and one all-gather.":
        "第 {step} 步调用的是 {names}：ZeRO-1 每一步需要一次归约-散射和一次全收集。",
    "the ranks keep {kept} values of optimizer state: each needs only its chunk, {chunk}.":
        "各 rank 保存的优化器状态分别有 {kept} 个值：每个 rank 只需要保存自己那一块，即 {chunk} 个。",
    "the ranks' weights differ after training: all-gather every rank's updated chunk into the parameters.":
        "训练后各 rank 的权重不一致：要把每个 rank 更新后的那一块全收集回参数中。",
    "step {step} used the sum of the ranks' gradients: divide the reduce-scattered chunk by world_size.":
        "第 {step} 步用的是各 rank 梯度之和：要把归约-散射得到的那一块除以 world_size。",
    "step {step} divided the gradient by world_size twice: once, after the reduce-scatter, is enough.":
        "第 {step} 步把梯度除了两次 world_size：在归约-散射之后除一次就够了。",
    ("after step {step} the weights differ from one process on the global batch by {gap:.3g}: does each rank "
     "reduce-scatter the gradients (not the parameters), update exactly its own chunk (rank * chunk to (rank + 1) "
     "* chunk) with velocity = momentum * velocity + gradient (torch's SGD: no dampening), and write the "
     "all-gathered values back into the parameters?"):
        ("第 {step} 步之后，权重与单个进程在全局批次上训练的结果相差 {gap:.3g}：每个 rank 是否对梯度（而不是参数）"
         "做了归约-散射，是否恰好只更新自己那一块（从 rank * chunk 到 (rank + 1) * chunk），"
         "并按 velocity = momentum * velocity + gradient 更新（torch 的 SGD：没有 dampening），"
         "最后把全收集得到的值写回参数？"),
    ("on 2 and 3 ranks: one reduce-scatter and one all-gather a step, 1/world_size of the momentum on each rank, "
     "and the weights of one process on the global batch."):
        ("在 2 个和 3 个 rank 上：每一步一次归约-散射和一次全收集，每个 rank 只保存 1/world_size 的动量，"
         "权重与单个进程在全局批次上训练的结果相同。"),
    ": too high": "：偏高",
    ": too low": "：偏低",
    "replace each ... with your prediction in bytes, then run the cell again.":
        "把每个 ... 换成你预测的字节数，再运行这个单元格。",
    "your prediction": "你的预测",
    ("{problem}{direction}, as measured on rank 0 of {world_size}. Mind the padding of the flat buffer to a "
     "multiple of the world size, and Adam's 4-byte step counter."):
        ("{problem}{direction}（以 {world_size} 个 rank 中 rank 0 的实测值为准）。"
         "注意扁平缓冲区要填充到进程总数的整数倍，还有 Adam 的 4 字节 step 计数器。"),
    "measured on {world_size} gloo ranks, rank 0 holds exactly what you predicted: {measured}.":
        "在 {world_size} 个 gloo rank 上实测，rank 0 持有的字节数与你的预测完全一致：{measured}。",
    "the ring_all_gather skeleton": "ring_all_gather 骨架",
    "write its loop": "写出其中的循环",
    "rank {rank}, a {dtype} tensor of shape {shape}": "rank {rank} 上形状为 {shape} 的 {dtype} 张量",
    "{where}: {problem}": "{where}：{problem}",
    ("{where}: it sent {sent} bytes where {pieces} pieces of {mine} are enough: send each piece on once, the one "
     "that arrived last."):
        ("{where}：它发送了 {sent} 字节，而 {pieces} 块、每块 {mine} 字节就够了：每一步只转发刚收到的那一块，"
         "每块只转发一次。"),
    "your code called dist.{name}: build the all-gather from isend/irecv (or send/recv) only.":
        "你的代码调用了 dist.{name}：只能用 isend/irecv（或 send/recv）来实现全收集。",
    ("it sent to rank {peer}: in the ring rank {rank} sends to its right neighbour {right} only and receives from "
     "its left neighbour {left} only."):
        "它向 rank {peer} 发送了消息：在环中，rank {rank} 只向右邻居 {right} 发送，只从左邻居 {left} 接收。",
    ("it received from rank {peer}: in the ring rank {rank} sends to its right neighbour {right} only and "
     "receives from its left neighbour {left} only."):
        "它从 rank {peer} 接收了消息：在环中，rank {rank} 只向右邻居 {right} 发送，只从左邻居 {left} 接收。",
    "the result has shape {shape}, where dist.all_gather's concatenation has {want}.":
        "结果的形状是 {shape}，而 dist.all_gather 拼接后的形状是 {want}。",
    "the result's pieces hold the tensors of ranks {whose} (None: nobody's), where piece k must hold rank k's.":
        "结果的各块依次是 rank {whose} 的张量（None 表示不属于任何 rank），而第 k 块必须是 rank k 的张量。",
    ("on {world_size} ranks a rank waited {timeout_s:g} s for a message that never came (a hang): if every rank "
     "first blocks in recv (or send), nobody sends; post the receive and the send together (dist.irecv, "
     "dist.isend, then wait for both) {logs}."):
        ("在 {world_size} 个 rank 上，有个 rank 等了 {timeout_s:g} 秒也没等到消息（程序卡死了）："
         "如果每个 rank 都先阻塞在 recv（或 send）上，就没有人发送；要同时发起接收和发送（先 dist.irecv、dist.isend，"
         "再等待两者完成）{logs}。"),
    ("{failure} A message whose size differs from its receive buffer aborts gloo: send exactly one piece, into a "
     "piece of the same shape."):
        "{failure}消息的大小与接收缓冲区不同时，gloo 会中止：每次恰好发送一块，接收端也用形状相同的一块来接收。",
    ("on 3 and 4 ranks, five shapes and dtypes: dist.all_gather's result, from messages to the right neighbour "
     "only, (W - 1) pieces sent by each rank."):
        ("在 3 个和 4 个 rank 上，五种形状和数据类型：结果与 dist.all_gather 相同，消息只发给右邻居，"
         "每个 rank 发送 (W - 1) 块。"),
    "a {n} x {k} matrix M and a {k} x {r} Q": "一个 {n} x {k} 的矩阵 M 和一个 {k} x {r} 的 Q",
    # notebook 07's capstone (capstone.py)
    "the real-job skeleton": "真实任务脚本的骨架",
    "write its four functions": "写出其中的四个函数",
    ("clip_grad_norm_ comes before scaler.unscale_(optimizer): with fp16 it would clip the scaled gradients, thousands "
     "of times too large; call scaler.unscale_(optimizer) first."):
        "clip_grad_norm_ 出现在 scaler.unscale_(optimizer) 之前：用 fp16 时它裁剪的是放大过的梯度，大了几千倍；请先调用 scaler.unscale_(optimizer)。",
    ("no_sync() must wrap the forward as well as the backward: DDP decides in the forward whether the backward "
     "all-reduces"):
        "no_sync() 必须同时包住前向和反向：DDP 在前向时就决定反向是否做全归约",
    "run every micro-batch but a step's last under model.no_sync()": "除了每一步的最后一个微批次，其余微批次都要放在 model.no_sync() 里运行",
    ("DDP all-reduced the gradients {buckets} times for {steps} optimizer steps (one bucket each): every micro-batch "
     "synchronised; {where}."):
        "DDP 对梯度做了 {buckets} 次全归约，而优化器只走了 {steps} 步（每次一个桶）：每个微批次都做了同步；{where}。",
    ("DDP all-reduced the gradients {buckets} times for {steps} optimizer steps: a step's last micro-batch must run "
     "outside no_sync(), or the ranks step on gradients they never averaged."):
        "DDP 对梯度做了 {buckets} 次全归约，而优化器走了 {steps} 步：每一步的最后一个微批次必须在 no_sync() 之外运行，否则各 rank 用的是从未平均过的梯度。",
    ("rank {rank} wrote the checkpoint too: only rank 0 may write it (under `if rank == 0:`), or the ranks overwrite "
     "each other's file."):
        "rank {rank} 也写了检查点：只有 rank 0 可以写（放在 `if rank == 0:` 下面），否则各 rank 会互相覆盖文件。",
    "nothing was written at --checkpoint {path}: rank 0 must torch.save the state there after every epoch.":
        "--checkpoint {path} 处什么也没写：rank 0 必须在每一轮之后用 torch.save 把状态保存到那里。",
    ("rank 0 wrote straight into {path}: a run killed mid-write leaves half a file; write a temporary file and "
     "os.replace it onto {path}."):
        "rank 0 直接写进了 {path}：写到一半被杀掉的运行会留下半个文件；请先写一个临时文件，再用 os.replace 把它换到 {path}。",
    "rank 0 never renamed a file onto {path}: write a temporary file, then os.replace(tmp, {path}).":
        "rank 0 从未把文件重命名为 {path}：请先写一个临时文件，再调用 os.replace(tmp, {path})。",
    ("stopped after epoch 1, the resumed run trained epochs {epochs}: load_checkpoint must return the epoch the "
     "checkpoint saved (next_epoch), so that training goes on at epoch 2."):
        "在第 1 轮后停下，恢复后的运行训练的是第 {epochs} 轮：load_checkpoint 必须返回检查点保存的轮次（next_epoch），训练才会从第 2 轮接着进行。",
    ("on resume rank {rank} never loaded an optimizer state: optimizer.load_state_dict(...) on every rank, or SGD's "
     "momentum starts again from zero."):
        "恢复时 rank {rank} 没有加载优化器状态：每个 rank 都要调用 optimizer.load_state_dict(...)，否则 SGD 的动量会从零开始。",
    "stopped after epoch 1 and resumed on {world_size} ranks": "在 {world_size} 个 rank 上训练一轮后停下再恢复",
    "on {world_size} ranks": "在 {world_size} 个 rank 上",
    "{what}, nothing was saved at --out: keep main()'s torch.save of the model.":
        "{what}，--out 处什么也没保存：请保留 main() 中保存模型的 torch.save。",
    ("{what}, the weights differ from one process on the batch of {batch} by up to {gap:.3g}: is each loss divided by "
     "the group's number of samples, and are the optimizer and scaler restored?"):
        "{what}，权重与批次为 {batch} 的单进程最多相差 {gap:.3g}：每个损失是否都除以了这一组的样本数？优化器和 scaler 是否都恢复了？",
    ("{what}, the held-out scores are {got}, one process prints {expected}: score every held-out sample once (rank r "
     "takes r, r + W, ...; a DistributedSampler pads with repeats) and all-reduce the sums and the count."):
        "{what}，验证集得分是 {got}，单进程打印的是 {expected}：每个验证集样本恰好评估一次（rank r 取第 r、r + W、……个；DistributedSampler 会用重复样本填充），并对各项之和与样本数做全归约。",
    ("on 2 ranks (stopped after epoch 1 and resumed) and on 3, your script ends with the weights and prints the scores "
     "of one process on the global batch of {batch}, with one all-reduce per optimizer step and a checkpoint rank 0 "
     "alone writes and renames into place."):
        "在 2 个 rank 上（训练一轮后停下再恢复）和 3 个 rank 上，你的脚本得到的权重和打印的得分都与全局批次为 {batch} 的单进程相同；每个优化器步骤只做一次全归约，检查点只由 rank 0 写入并重命名到位。",
    # notebook 08's exercise 5: the FSDP2 script (fsdp_check.py)
    "the FSDP2 skeleton": "FSDP2 脚本的骨架",
    "write its three functions": "写出其中的三个函数",
    "build_model never called fully_shard: shard each Block of model.blocks, then the model itself.":
        "build_model 从未调用 fully_shard：先对 model.blocks 中的每个 Block 分片，再对整个模型分片。",
    ("fully_shard was called on {what}: each of the {layers} Blocks needs a call of its own (a group whose weights are "
     "whole only for its forward and backward), then the model itself, last."):
        "fully_shard 依次作用在 {what} 上：{layers} 个 Block 各自都需要一次单独的调用（每个 Block 自成一个分组，其权重只在它自己的前向和反向期间才是完整的），最后再对整个模型调用一次。",
    ("the model had real weights when fully_shard split it, so every rank first held the whole model: build it under "
     "`with torch.device(\"meta\"):`, shard it, then model.to_empty(device=device)."):
        "fully_shard 切分模型时，模型已经有了真实的权重，也就是说每个 rank 都先持有了整个模型：请在 `with torch.device(\"meta\"):` 下构建它，分片之后再调用 model.to_empty(device=device)。",
    "nothing was saved with dcp.save: save_checkpoint must call it, on every rank.":
        "没有用 dcp.save 保存任何东西：save_checkpoint 必须调用它，而且每个 rank 都要调用。",
    ("rank {rank} never called {call} while rank {other} did: DCP is a collective in which every rank writes or reads "
     "its own shards; call it on every rank, outside `if rank == 0:`."):
        "rank {other} 调用了 {call}，而 rank {rank} 从未调用：DCP 的保存和加载都是集合通信，每个 rank 写出或读取自己的分片；请在每个 rank 上调用它，放在 `if rank == 0:` 之外。",
    ("the model itself was sharded before its blocks, so its group took the blocks' parameters too: call fully_shard "
     "on each Block first, then on the model, last."):
        "整个模型先于它的各个 Block 被分片，于是它的分组把这些 Block 的参数也拿走了：请先对每个 Block 调用 fully_shard，最后再对整个模型调用。",
    ("dcp.save wrote straight into {path}: a run killed mid-save leaves a folder that looks whole; save into "
     "{path}.tmp, then rank 0 renames it with os.replace."):
        "dcp.save 直接写进了 {path}：保存到一半被杀掉的运行会留下一个看起来完整的文件夹；请保存到 {path}.tmp，再由 rank 0 用 os.replace 重命名。",
    "after {steps} steps there is no {path}: rank 0 must rename the folder dcp.save wrote onto it (os.replace).":
        "训练 {steps} 步之后没有 {path}：rank 0 必须把 dcp.save 写出的文件夹重命名为 {path}（os.replace）。",
    ("the checkpoint holds no optimizer state (no exp_avg in {path}): save both halves of get_state_dict(model, "
     "optimizer), or AdamW's moments start again from zero on resume."):
        "检查点里没有优化器状态（{path} 中没有 exp_avg）：请把 get_state_dict(model, optimizer) 返回的两部分都保存下来，否则恢复时 AdamW 的一阶矩和二阶矩会从零开始。",
    ("on resume rank 0 never called dcp.load: every rank reads the pieces of its own shards, whatever the world size "
     "that wrote them."):
        "恢复时 rank 0 从未调用 dcp.load：每个 rank 都要读取属于自己分片的那些片段，无论写入它们时的进程总数是多少。",
    "resumed on {world_size} ranks, nothing was saved at --out: keep main()'s save_full_weights.":
        "在 {world_size} 个 rank 上恢复后，--out 处没有保存任何东西：请保留 main() 中的 save_full_weights。",
    ("stopped after {stop} steps on 2 ranks and resumed on {world_size}, the weights differ from one device by up to "
     "{gap:.3g}: does load_checkpoint fill the model's and the optimizer's shards (get_state_dict, dcp.load, "
     "set_state_dict)?"):
        "在 2 个 rank 上训练 {stop} 步后停下、在 {world_size} 个 rank 上恢复，得到的权重与单设备最多相差 {gap:.3g}：load_checkpoint 是否把模型和优化器的分片都填好了（get_state_dict、dcp.load、set_state_dict）？",
    ("stopped after {stop} of {steps} steps on 2 ranks and resumed on 3, your script ends with the weights of one "
     "device on the same {batch} windows a step: each block, then the root, sharded on the meta device, and every "
     "rank saving and loading its own shards with DCP, renamed into place."):
        "在 2 个 rank 上训练 {steps} 步中的 {stop} 步后停下、在 3 个 rank 上恢复，你的脚本得到的权重与单设备在每步同样 {batch} 个窗口上训练的结果相同：在 meta 设备上先对每个块、再对根模块分片，每个 rank 都用 DCP 保存和加载自己的分片，并重命名到位。",
    "the live_mean skeleton": "live_mean 骨架",
    "write its body": "写出它的函数体",
    "with rank(s) {dead} dead, rank {rank}": "在 rank {dead} 挂掉的情况下，rank {rank}",
    "with every rank alive, rank {rank}": "在所有 rank 都存活的情况下，rank {rank}",
    "{where} returned {got}, where {live} ranks are alive: return how many are.":
        "{where}返回了 {got}，而存活的 rank 有 {live} 个：请返回存活的 rank 数。",
    ("dead in this case, it kept its own values: it takes the survivors' mean too (a replica that comes back heals "
     "from it)."):
        "它在这种情况下已经挂掉，却保留了自己的值：它也要拿到存活副本的平均值（重新回来的副本要靠它恢复）。",
    ("its gradients became the mean over all {world_size} ranks: a dead replica's values must not count (let it send "
     "zeros)."):
        "它的梯度变成了全部 {world_size} 个 rank 的平均：挂掉的副本的值不能计入（让它发送零）。",
    ("its gradients became the live ranks' sum divided by {world_size}: divide by the number of ranks alive, not by "
     "the world size."):
        "它的梯度变成了存活 rank 的和除以 {world_size}：应当除以存活的 rank 数，而不是进程总数。",
    "its gradients became {got} where the live ranks' mean is {want}.":
        "它的梯度变成了 {got}，而存活 rank 的平均是 {want}。",
    ("on 3 and 4 ranks, with no rank, one or all but one dead, in float32 and float64: every rank holds the live "
     "ranks' mean, and knows how many they are."):
        "在 3 个和 4 个 rank 上，无论没有 rank 挂掉、挂掉一个，还是只剩一个存活，float32 和 float64 下每个 rank 都持有存活 rank 的平均值，并知道存活的有几个。",
    "the step that failed was not finished: it is taken again too": "失败的那一步并没有完成：它也要重新做一遍",
    # the plotting helpers' labels (tool/plotting.py)
    'compute only': '只有计算',
    'after backward': '反向之后再通信',
    'overlapped': '重叠',
    'step': '步',
    'loss': '损失',
    'rows': '行数',
    "position in the rank's shard (red frame: a padded repeat)": '在该 rank 分片中的位置（红框：填充用的重复样本）',
    'batch\n{total} rows\n(device 0)': '批次\n{total} 行\n（设备 0）',
    'outputs\n{total} rows\ngathered on\ndevice 0': '输出\n{total} 行\n收集到\n设备 0',
    'scatter\n(+ replicate)': '分发\n（+ 复制模型）',
    'gather': '收集',
    "ms since the backward started (an all-reduce's bar: launched to completed, waiting included)": '反向传播开始后的毫秒数（全归约的条：从发起到完成，含等待）',
    'each all-reduce is launched while the backward still computes': '每次全归约都在反向传播仍在计算时发起',
    'all-reduces per step': '每步全归约次数',
    'ms per step': '每步毫秒数',
    'KiB held by one rank': '一个 rank 持有的 KiB',
    'global batch\n{n} shards': '全局批次\n{n} 个分片',
    'all-reduce\n({mean}) / {n}\nevery rank gets it': '全归约\n({mean}) / {n}\n每个 rank 都得到它',
    'during backward()': '在 backward() 期间',
    "(DDP(model) gave every\nrank rank 0's weights)": '（DDP(model) 已让每个\nrank 拿到 rank 0 的权重）',
    'one training step of DistributedDataParallel on {n} processes': 'DistributedDataParallel 在 {n} 个进程上的一个训练步',
    'all-reduce the gradients: 2(W−1)/W · Ψ': '全归约梯度：2(W−1)/W · Ψ',
    'reduce-scatter the gradients, all-gather the\nparameters: the same bytes as DDP': '归约-散射梯度，全收集\n参数：字节数与 DDP 相同',
    'the same collectives; the full gradient\nis dropped after its reduce-scatter': '集合通信相同；完整梯度\n在归约-散射之后即丢弃',
    "all-gather each layer's parameters in the forward\nand again in the backward: 1.5 × DDP's bytes": '前向时全收集每层参数，\n反向时再收集一次：DDP 字节数的 1.5 倍',
    'what each of {n} ranks holds (coloured: kept; grey frame: the whole; height: bytes)': '{n} 个 rank 各自持有什么（着色：保留的部分；灰框：整体；高度：字节数）',
    "each rank's {n} chunks after every step: how many ranks' values a chunk sums (Σ: all {n})": '每一步之后每个 rank 的 {n} 个数据块：一块累加了几个 rank 的值（Σ：全部 {n} 个）',
    'GB per rank': '每个 rank 的 GB',
    "time / {baseline}'s (below 1: faster)": '耗时 / {baseline} 的耗时（低于 1：更快）',
    "ms from the forward's start (dashed: the backward starts)": '前向开始后的毫秒数（虚线：反向开始）',
    "who each step's average counted: a gap is a step without that replica": '每一步的平均计入了谁：空缺处是少了该副本的步',
    '{label}: non-finite loss': '{label}：非有限的损失',
    'training loss: thin lines are single ranks': '训练损失：细线是单个 rank',
    'training loss': '训练损失',
    'rank {rank}': 'rank {rank}',
    'mean of {n} ranks': '{n} 个 rank 的平均',
    'epoch mean': '每轮平均',
    'dev {d}': '设备 {d}',
    'replica {i}\n{rows} rows': '副本 {i}\n{rows} 行',
    'layer {name}': '第 {name} 层',
    ' backward\n returns': ' backward\n 返回',
    'default': '默认',
    'ideal: S(N) = N': '理想：S(N) = N',
    'ceiling: N independent processes': '上限：N 个独立进程',
    'world size N': '进程总数 N',
    'speed-up T(N) / T(1)': '加速比 T(N) / T(1)',
    'per-process batch {batch}': '每进程批次 {batch}',
    'ring_all_reduce (ours)': 'ring_all_reduce（我们的）',
    'message size': '消息大小',
    'bus bandwidth (GB/s)': '总线带宽（GB/s）',
    'all-reduce on {n} ranks': '{n} 个 rank 上的全归约',
    'per-process batch': '每进程批次',
    'DDP / ceiling': 'DDP / 上限',
    'more compute per step hides the all-reduce': '每步计算越多，越能掩盖全归约',
    'rank {rank}: a full model copy\nforward + backward\non shard {rank}: gradient g{rank}': 'rank {rank}：一份完整模型\n在分片 {rank} 上前向 + 反向：\n得到梯度 g{rank}',
    'rank {rank}: optimizer.step()\nwith the average\n→ the same weights': 'rank {rank}：用平均梯度\noptimizer.step()\n→ 相同的权重',
    'parameters': '参数',
    'gradients': '梯度',
    'optimizer state': '优化器状态',
    'activations': '激活值',
    'MiB handed to collectives by one rank (log scale)': '一个 rank 交给集合通信的 MiB（对数坐标）',
    'held-out accuracy (%)': '验证集准确率（%）',
    'accuracy against bytes sent: up and to the left is better': '准确率与发送字节数：越靠左上越好',
    'compute': '计算',
    'replica {replica} killed before step {step}': '副本 {replica} 在第 {step} 步之前被杀死',
    'replica': '副本',
    '{label} (mean of {n} ranks)': '{label}（{n} 个 rank 的平均）',
    'backward (compute)': '反向传播（计算）',
    'gradients ready': '梯度就绪',
    'step time': '每步耗时',
    '{name} (measured, not asserted)': '{name}（实测，不作断言）',
    'start': '开始',
    'exposed communication ({ms} ms)': '暴露的通信（{ms} ms）',
    'replica {r}': '副本 {r}',
    '{label} rank {rank}': '{label} 的 rank {rank}',
    'DataParallel, CPU emulation (threads)': 'DataParallel，CPU 模拟（线程）',
    ' = formula': ' = 公式',
    '\n(formula {formula})': '\n（公式 {formula}）',
    'epoch {epoch}': '第 {epoch} 轮',
    '{method} without error feedback': '{method}（不带误差反馈）',
    'communication': '通信',
    'collective {i}': '集合通信 {i}',
    'formula': '公式',
    'cost model': '代价模型',
    '{part} ({size} B each)': '{part}（每个 {size} B）',
    "that is the mean: all_reduce sums by default (the average is DDP's own doing: it divides each gradient by the world size)":
        '这是平均值：all_reduce 默认求和（求平均是 DDP 自己做的：它把每个梯度除以进程总数）',
    'epochs count from 1 here: the first epoch is epoch 1':
        '这里的轮次从 1 开始数：第一轮就是第 1 轮',
    'that is what rank 1 held before: all_reduce changes the tensor in place on every rank':
        '这是 rank 1 原来的值：all_reduce 会在每个进程上原地修改张量',
    "that is rank 0's tensor: all_reduce sums every rank's, it does not copy one":
        '这是 rank 0 的张量：all_reduce 把所有进程的张量相加，而不是复制其中一个',
    "that is tensor_split's rule (sizes differ by at most one): DataParallel scatters with chunk, ceil(17 / 5) = 4 rows a device until the rows run out":
        '这是 tensor_split 的规则（各份最多差一行）。DataParallel 用 chunk 分发：每个设备 ceil(17 / 5) = 4 行，直到行数用完',
    'chunk does not put the rest on the last device: it gives ceil(17 / 5) = 4 rows a device until the rows run out':
        'chunk 不会把余下的行都放到最后一个设备上。它给每个设备 ceil(17 / 5) = 4 行，直到行数用完',
    'chunk gives each device ceil(9 / 8) = 2 rows, so the rows run out before the last devices':
        'chunk 给每个设备 ceil(9 / 8) = 2 行，所以还没轮到最后几个设备，行就用完了',
    'there are only 8 devices, and chunk gives each ceil(9 / 8) = 2 rows':
        '一共只有 8 个设备，而且 chunk 给每个设备 ceil(9 / 8) = 2 行',
    'the sampler pads with the first indices of its order, not the last':
        '采样器用排列开头的下标来填充，而不是末尾的',
    'that counts one byte per parameter: a float32 holds 4':
        '这里每个参数只算了 1 字节，而一个 float32 占 4 字节',
    '87.5 MB is the reduce-scatter alone: the all-gather sends as much again':
        '87.5 MB 只是归约-散射这一段，全收集还要再发送同样多',
    'each phase takes W - 1 = 7 steps of 100 / 8 MB, not 8 steps':
        '每一段是 W - 1 = 7 步，每步 100 / 8 MB，不是 8 步',
    'the naive ring forwards the tensor W - 1 = 7 times, not 8: no rank sends to itself':
        '朴素环把张量转发 W - 1 = 7 次，不是 8 次：没有进程会发给自己',
    "the naive ring makes one pass, W - 1 hops of the whole tensor; two phases are the ring's":
        '朴素环只走一遍，整块张量转发 W - 1 次。分成两段的是环形全归约',
    'the backward produces the gradients last first (0.5, 4, 1, 1, 4), and a bucket takes the tensor that crosses the cap before it closes':
        '反向传播从最后一个参数开始产生梯度（0.5、4、1、1、4）。越过上限的那个张量会先放进桶里，桶才关闭',
    'the gradients become ready from the head backwards: count from the last parameter':
        '梯度从输出层开始往前依次就绪：请从最后一个参数数起',
    "DDP's small first bucket of 1 MiB is used only when bucket_cap_mb is not given":
        '只有不传 bucket_cap_mb 时，DDP 才使用 1 MiB 的小首桶',
    '100 MB is the gradient itself: a ring all-reduce sends 2(W - 1)/W of it per rank':
        '100 MB 是梯度本身的大小。环形全归约中每个进程发送它的 2(W - 1)/W',
    '50 MB is the fp16 gradient itself: a ring all-reduce sends 2(W - 1)/W of it per rank':
        '50 MB 是 fp16 梯度本身的大小。环形全归约中每个进程发送它的 2(W - 1)/W',
    "that variance divides by N - 1 (torch.var's default): BatchNorm normalises with the biased one, divided by N":
        '这个方差除以的是 N - 1（torch.var 的默认做法）。BatchNorm 用的是有偏方差，除以 N',
    'the sampler pads 10 samples to 12, so that each of the 4 ranks gets 3':
        '采样器把 10 个样本填充到 12 个，让 4 个进程各拿 3 个',
    'steps count from 0 here: after 15 steps the next one is step 15':
        '这里的步数从 0 开始数：走完 15 步之后，下一步是第 15 步',
    'a step takes 2 ranks x 10 = 20 samples: 5 steps an epoch, not 10':
        '每一步用掉 2 个进程 x 10 = 20 个样本，所以一轮是 5 步，不是 10 步',
    'nothing was saved, so the new group cannot know where the old one was: it starts over':
        '什么都没保存，新的进程组无从得知旧进程组走到了哪里，只能从头开始',
    "2 GB is ZeRO-3's figure, which shards the parameters too; ZeRO-2 keeps every parameter":
        '2 GB 是 ZeRO-3 的数字，它连参数也分片。ZeRO-2 保留全部参数',
    "9 GB is ZeRO-1's figure, which keeps every gradient; ZeRO-2 shards the gradients too":
        '9 GB 是 ZeRO-1 的数字，它保留全部梯度。ZeRO-2 还会把梯度分片',
    "16 GB is DDP's figure, which shards nothing":
        '16 GB 是 DDP 的数字，它什么都不分片',
    "3.75 GB is the paper's mixed precision (2 + 2 + 12 bytes); this exercise asks for fp32 Adam, 4 + 4 + 8":
        '3.75 GB 用的是论文中的混合精度（2 + 2 + 12 字节）。本题问的是 fp32 Adam，即 4 + 4 + 8',
    '1 / f treats the parallel third as the whole step: the serial 2/3 stays, so the limit is 1 / (1 - f)':
        '1 / f 把可并行的三分之一当成了整步。串行的 2/3 始终存在，所以上限是 1 / (1 - f)',
    'PowerSGD sends two factors, P (4096 x 8) and Q (4096 x 8), not one':
        'PowerSGD 发送两个因子 P（4096 x 8）和 Q（4096 x 8），不是一个',
    'that counts each factor twice: P is 4096 x 8 and Q is 4096 x 8, once each':
        '这样每个因子算了两次。P 是 4096 x 8，Q 也是 4096 x 8，各发一次',
    "32 is DDP's bytes over DiLoCo's: the share asked for is its inverse":
        '32 是 DDP 与 DiLoCo 的字节数之比。题目要的占比是它的倒数',
    'the number of ranks does not enter: each sends the parameters once per 32 steps, as DDP sends the gradients once per step':
        '进程数不影响结果：DiLoCo 每 32 步发送一次参数，DDP 每步发送一次梯度',
    '4000 MB is every fragment: one synchronisation sends one fragment, a quarter':
        '4000 MB 是全部片段的大小。一次同步只发送一个片段，也就是四分之一',
    "250 million is the fragment's values: each is 4 bytes of fp32":
        '2.5 亿是一个片段的数值个数。每个 fp32 数值占 4 字节',
    'a chunk keeps its sum after it is forwarded: count the chunks this rank received in earlier steps too':
        '数据块转发出去之后，它的和仍然留在本进程。前几步收到的数据块也要算上',
    "one too few: a chunk that arrives holds the sender's sum, and the receiver adds its own values to it":
        '少算了一个：收到的数据块带着发送方的和，接收方还要再加上自己的值',
    '{n} GPUs and NCCL: one process per GPU on nccl': '{n} 块 GPU，有 NCCL：每块 GPU 一个进程，用 nccl',
    '1 GPU: real DDP needs >= 2 GPUs, so 2 CPU processes on gloo': '只有 1 块 GPU：真正的 DDP 至少要 2 块，所以用 2 个 CPU 进程，走 gloo',
    'GPUs found but this torch has no NCCL, so 2 CPU processes on gloo': '有 GPU，但这个 torch 没有 NCCL，所以用 2 个 CPU 进程，走 gloo',
    'no GPU: 2 CPU processes on gloo': '没有 GPU：用 2 个 CPU 进程，走 gloo',
    'none': '无',
    'cpu cores': 'CPU 核数',
    'gpus': 'GPU',
    'platform': '平台',
    'cuda initialised here': '本进程已初始化 CUDA',
    'nccl available': '可用 NCCL',
    'train would use': 'train 将使用',
    'why': '原因',
    'True': '是',
    'False': '否',
    'bucket {k}':
        '桶 {k}',
    "MiB of gradients the backward has produced, last layer first (▼: a bucket's all-reduce starts)":
        '反向传播已产生的梯度（MiB），从最后一层开始（▼：一个梯度桶的全归约开始）',
    "DDP's buckets: each is all-reduced once its last gradient is ready":
        'DDP 的梯度桶：桶里最后一个梯度就绪，就对它做全归约',
    'real nn.DataParallel: one process driving N GPUs':
        '真正的 nn.DataParallel：一个进程驱动 N 块 GPU',
    "CPU emulation (dp_helpers.scratch.dataparallel.scatter_gather): one process, N threads running the replicas' forward; autograd runs the whole backward on one CPU thread, so this is not a prediction for GPUs":
        'CPU 上的模拟实现（dp_helpers.scratch.dataparallel.scatter_gather）：一个进程，N 个线程运行各副本的前向；autograd 在一个 CPU 线程上跑完整个反向传播，所以它不能预测 GPU 上的表现',
    'needs a CUDA GPU and NCCL; found {n} GPU(s), nccl={nccl}':
        '需要 CUDA GPU 和 NCCL；找到 {n} 块 GPU，nccl={nccl}',
    'step {step} done on {n} ranks':
        '第 {step} 步在 {n} 个 rank 上完成',
    'node {node} killed (its agent and its worker)':
        '节点 {node} 被杀掉（它的代理和工作进程）',
    'resumed on {n} ranks':
        '在 {n} 个 rank 上恢复',
    'node {node} started again':
        '节点 {node} 重新启动',
    'every agent exited':
        '所有代理都已退出',
}
