#!/usr/bin/python3
"""PyTorch's MNIST example (pytorch/examples, mnist/main.py) on apsd.

The network, Adadelta, StepLR(step_size=1, gamma=0.7), the train and test
loops and their printing are the original's; the lines marked "apsd:" are
what a script needs to train on several ranks through apsd:

- one aps.Client per process (rank and world size from the environment:
  torchrun's RANK/WORLD_SIZE, Slurm's, APS_RANK/APS_WORLD_SIZE, or aps.launch),
- rank 0's weights broadcast to every rank before training,
- the optimizer wrapped in aps.torch.DistributedOptimizer, a torch
  optimizer, so StepLR is made on the wrapper,
- a DistributedSampler that gives each rank its share of every epoch,
- printing on rank 0 only,
- client.close() at the end: without it the daemon sees the rank vanish and
  counts it as lost.

There is no MNIST download here: the data is Debian's dataset-fashion-mnist
(the same 28x28 idx files, of clothes), read as train_fashion_mnist.py does.
Every rank evaluates the same model on the test set (--test-size images);
rank 0 prints. The loop runs through GradScaler(enabled=False), as an AMP
script does on CPU (torch 1.13 has no CPU grad scaler).

    PYTHONPATH=worker/python python3 -m aps.launch -n 2 worker/examples/mnist_port.py \\
        --epochs 3 --steps 20 --test-size 1000
"""

import argparse
import json
import pathlib
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
import aps  # noqa: E402
import aps.torch  # noqa: E402
import fashion_mnist  # noqa: E402


class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = self.conv1(x)
        x = F.relu(x)
        x = self.conv2(x)
        x = F.relu(x)
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = self.fc1(x)
        x = F.relu(x)
        x = self.dropout2(x)
        x = self.fc2(x)
        output = F.log_softmax(x, dim=1)
        return output


def train(args, model, device, train_loader, optimizer, scaler, epoch, rank):
    model.train()
    losses = []
    for batch_idx, (data, target) in enumerate(train_loader):
        if batch_idx == args.steps:  # apsd port: --steps, a short run
            break
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        scaler.scale(loss).backward()  # apsd: gradients leave for apsd as backward makes them
        scaler.step(optimizer)  # the mean over ranks, then Adadelta
        scaler.update()
        losses.append(loss.item())
        if batch_idx % args.log_interval == 0:
            if rank == 0:  # apsd: rank 0 prints
                print('Train Epoch: {} [{}/{} ({:.0f}%)]\tLoss: {:.6f}'.format(
                    epoch, batch_idx * len(data), len(train_loader.sampler),
                    100. * batch_idx / len(train_loader), loss.item()), flush=True)
            if args.dry_run:
                break
    return losses


def test(model, device, test_loader, rank):
    model.eval()
    test_loss = 0
    correct = 0
    with torch.no_grad():
        for data, target in test_loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction='sum').item()  # sum up batch loss
            pred = output.argmax(dim=1, keepdim=True)  # get the index of the max log-probability
            correct += pred.eq(target.view_as(pred)).sum().item()

    test_loss /= len(test_loader.dataset)

    if rank == 0:  # apsd: rank 0 prints
        print('\nTest set: Average loss: {:.4f}, Accuracy: {}/{} ({:.0f}%)\n'.format(
            test_loss, correct, len(test_loader.dataset),
            100. * correct / len(test_loader.dataset)), flush=True)
    return test_loss, 100. * correct / len(test_loader.dataset)


def dataset(split, size):
    """Fashion-MNIST's split as (N, 1, 28, 28) normalised images and labels."""
    images, labels = fashion_mnist.load(split)
    images, labels = torch.from_numpy(images[:size]), torch.from_numpy(labels[:size])
    return TensorDataset(images.view(-1, 1, 28, 28), labels)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='PyTorch MNIST Example on apsd')
    parser.add_argument('--batch-size', type=int, default=64, metavar='N',
                        help='input batch size for training, per rank (default: 64)')
    parser.add_argument('--test-batch-size', type=int, default=1000, metavar='N',
                        help='input batch size for testing (default: 1000)')
    parser.add_argument('--epochs', type=int, default=14, metavar='N',
                        help='number of epochs to train (default: 14)')
    parser.add_argument('--lr', type=float, default=1.0, metavar='LR',
                        help='learning rate (default: 1.0)')
    parser.add_argument('--gamma', type=float, default=0.7, metavar='M',
                        help='Learning rate step gamma (default: 0.7)')
    parser.add_argument('--no-cuda', action='store_true', default=False,
                        help='disables CUDA training')
    parser.add_argument('--dry-run', action='store_true', default=False,
                        help='quickly check a single pass')
    parser.add_argument('--seed', type=int, default=1, metavar='S',
                        help='random seed (default: 1)')
    parser.add_argument('--log-interval', type=int, default=10, metavar='N',
                        help='how many batches to wait before logging training status')
    parser.add_argument('--save-model', action='store_true', default=False,
                        help='For Saving the current Model')
    # apsd port: what the original does not have
    parser.add_argument('--steps', type=int, default=None, metavar='N',
                        help='at most N batches per epoch and rank (default: all)')
    parser.add_argument('--train-size', type=int, default=60000, help='training images used')
    parser.add_argument('--test-size', type=int, default=10000, help='test images evaluated')
    parser.add_argument('--format', default='e4m3', help='gradient format on the wire')
    parser.add_argument('--out', help='each rank writes its lr, losses and test results '
                        'here as JSON; {rank} in the path is replaced by the rank')
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    use_cuda = not args.no_cuda and torch.cuda.is_available()
    torch.set_num_threads(1)  # apsd: one thread per rank, several ranks per machine

    torch.manual_seed(args.seed)

    device = torch.device("cuda" if use_cuda else "cpu")

    client = aps.Client.from_env(format=args.format)  # apsd: this process is one rank of the job
    try:
        history = run(args, client, device, use_cuda)
    finally:
        client.close()  # apsd: BYE; a rank that exits without it is counted as lost
    if args.out:
        path = pathlib.Path(args.out.replace('{rank}', str(client.rank)))
        path.write_text(json.dumps(history, indent=1))


def run(args, client, device, use_cuda):
    rank = client.rank
    train_kwargs = {'batch_size': args.batch_size}
    test_kwargs = {'batch_size': args.test_batch_size}
    if use_cuda:
        cuda_kwargs = {'num_workers': 1,
                       'pin_memory': True}  # apsd: the sampler shuffles
        train_kwargs.update(cuda_kwargs)
        test_kwargs.update(cuda_kwargs)

    dataset1 = dataset("train", args.train_size)
    dataset2 = dataset("test", args.test_size)
    # apsd: each rank takes its share of every epoch
    sampler = DistributedSampler(dataset1, client.world_size, rank, seed=args.seed)
    train_loader = DataLoader(dataset1, sampler=sampler, **train_kwargs)
    test_loader = DataLoader(dataset2, **test_kwargs)

    model = Net().to(device)
    aps.torch.broadcast_parameters(model, client)  # apsd: rank 0's weights on every rank
    optimizer = aps.torch.DistributedOptimizer(  # apsd: the mean gradient over ranks
        optim.Adadelta(model.parameters(), lr=args.lr), client,
        named_parameters=model.named_parameters())
    scaler = torch.cuda.amp.GradScaler(enabled=False)

    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    history = {'rank': rank, 'world_size': client.world_size, 'lr': [], 'train_loss': [],
               'test_loss': [], 'accuracy': []}
    for epoch in range(1, args.epochs + 1):
        sampler.set_epoch(epoch)  # apsd: another shuffle every epoch, the same on every rank
        history['train_loss'] += train(args, model, device, train_loader, optimizer, scaler,
                                       epoch, rank)
        test_loss, accuracy = test(model, device, test_loader, rank)
        scheduler.step()
        history['lr'].append(optimizer.param_groups[0]['lr'])
        history['test_loss'].append(test_loss)
        history['accuracy'].append(accuracy)
    history['skipped_steps'] = optimizer.skipped_steps

    if args.save_model and rank == 0:  # apsd: every rank holds the same weights
        torch.save(model.state_dict(), "mnist_cnn.pt")
    return history


if __name__ == '__main__':
    main()
