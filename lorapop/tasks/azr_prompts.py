"""AZR's proposer and solver prompts for code_o, code_i and code_f, in substance (``selfplay.prompt_format: azr``).

Written after AZR's ``data_construction/prompts.py`` (paper branch; summarised in AZR.md section 7, the paper's
Figs 34-39): the same sections in the same order, the K reference snippets as ``<snippet_i>`` blocks holding
```python, ```input and ```output, the banned-keyword list, AZR's format example, and the blocks each reply must
hold. They are reworded, not copied, and differ from AZR's where lorapop's checks differ (so following the prompt
never costs a reward): no classes (lorapop's validity check refuses them; AZR allows them) and nothing after ``f``
at the top level (AZR strips it, lorapop refuses it). AZR's proposer prompts name the other task's difficulty in
their "Difficulty" bullet (code_i's asks for an output hard to predict, code_o's for an input hard to find); each
prompt here names its own task's. The text is wrapped in the R1 template by :mod:`lorapop.tasks.azr_format`.
"""

from __future__ import annotations

from lorapop.tasks.azr_format import AZR_BANNED_KEYWORDS
from lorapop.tasks.base import Task

# the example AZR shows in every prompt that asks for an input block
_EXAMPLE_INPUT = "'John', {'age': 20, 'city': 'New York'}"
_CODE_REQUIREMENTS = """\
- Name the entry function `f` (e.g., `def f(...): ...`); helper functions may be nested inside `f`
- `f` must return a value and take at least one input parameter
- Make the function deterministic
- AVOID THE FOLLOWING:
  * Random functions or variables
  * Date/time operations
  * I/O operations (reading files, network requests)
  * Printing or logging
  * Any external state
- Execution must finish within 10 seconds on a modern CPU
- Imports go at the very top of the snippet; no classes; the snippet ends with `f`: nothing may follow it"""

_PROPOSE_GOAL = {
    "code_o": ("deduce the output from the input",
               "The input will be given to a test subject, who must deduce the output",
               "Difficulty in predicting the output from your ```input and your ```python code"),
    "code_i": ("deduce one possible input from a given output",
               "The output will be given to a test subject, who must come up with any input that produces it",
               "Difficulty in predicting your ```input from 1) your ```python code and 2) the deterministic "
               "```output your input produces"),
}


def fenced(tag: str, body: str) -> str:
    return f"```{tag}\n{body}\n```"


def reference_snippets(references: list[Task]) -> str:
    """AZR's reference layout: ``<snippet_i>`` blocks with the program, its input and its output."""
    out = []
    for i, t in enumerate(references):
        blocks = [fenced("python", t.program), fenced("input", t.inputs[0] if t.inputs else ""),
                  fenced("output", t.outputs[0] if t.outputs else "")]
        out.append(f"<snippet_{i}>\n" + "\n".join(blocks) + f"\n</snippet_{i}>")
    return "\n".join(out)


def propose_program_input(task_type: str, references: list[Task],
                          banned: tuple[str, ...] = AZR_BANNED_KEYWORDS) -> str:
    """code_o / code_i proposer: a new program and one input, after K reference snippets."""
    goal, subject, difficulty = _PROPOSE_GOAL[task_type]
    example = "\n\n".join([fenced("python", "def f(name: str, info: dict):\n    # code logic here\n    return result"),
                           fenced("input", _EXAMPLE_INPUT)])
    return f"""## Task: Create a New Python Code Snippet with One Matching Input

Using the reference code snippets below as examples, design a new and unique Python code snippet that demands deep \
algorithmic reasoning to {goal}. Your submission holds a code snippet and one test input: the input is plugged into \
the snippet to produce the output. {subject}; this is meant to be an I.Q. test.

### Code Requirements:
{_CODE_REQUIREMENTS}
- Make the snippet require state tracking across several data transformations, so that the task takes long \
multi-step reasoning

### Input Requirements:
- Provide exactly one test input for your function
- Separate multiple arguments with commas
- Put quotes around string arguments

### Formatting:
- Your code in a ```python block:
{fenced("python", "def f(...):" + chr(10) + "    # your code here" + chr(10) + "    return ...")}
- Your input in an ```input block:
{fenced("input", "arg1, arg2, ...")}

### Example Format:
{example}

### Evaluation Criteria:
- Executability: your code must run on your input
- {difficulty}. Aim for algorithmic reasoning or logical complexity: for example data structures such as trees, \
heaps, stacks, queues or graphs, or involved control flow, dynamic programming, recursion, divide and conquer, \
greedy or backtracking
- Creativity: the code must be clearly different from the reference snippets
- Restricted keywords and packages: do not use the following words in any form, not even in comments: \
{', '.join(banned)}

First devise a clear plan: how your snippet will be challenging, distinct from the reference snippets and creative. \
Then write the final code snippet and its input.

### Reference Code Snippets:
{reference_snippets(references)}
"""


def propose_inputs_message(program: str, n_inputs: int) -> str:
    """code_f proposer: ``n_inputs`` inputs for a given program and a message for the test subject."""
    example = "\n".join([fenced("input", _EXAMPLE_INPUT),
                         fenced("input", "'Sammy', {'age': 37, 'city': 'Los Angeles'}")])
    return f"""## Task: Output {n_inputs} Inputs for the Code Snippet below that produce diverse Outputs, and a \
Message about the Snippet

Using the code snippet below, design {n_inputs} inputs that can be plugged into it to produce a diverse set of \
outputs. Some of your inputs with the outputs they deterministically produce will be given to a test subject, who \
must deduce the function; this is meant to be an I.Q. test. You also leave the test subject a message to help them \
deduce the code snippet.

### Input Requirements:
- Provide {n_inputs} valid inputs for the code snippet
- In each input, separate multiple arguments with commas
- Put quotes around string arguments
- Wrap each input in its own ```input block

### Message Requirements:
- Leave the test subject a message that helps them deduce the code snippet
- Wrap the message in a ```message block
- The message may take any form: a coding question, or a natural-language statement of what the snippet does
- The message must not contain the code snippet

### Formatting:
- Format each input as:
{fenced("input", "arg1, arg2, ...")}

### Example Format:
{example}

### Evaluation Criteria:
- Executability: the code snippet must run on each of your inputs
- Coverage: the inputs and their outputs cover the snippet's input space, enough to deduce the snippet from them
- Creativity: the inputs are clearly different from each other
- The inputs and the message together are challenging for the test subject, but not impossible
First devise a clear plan: understand the code snippet, then say how your inputs cover it and why they are \
challenging and creative. Then write the inputs and the message, each input in an ```input block and the message in \
a ```message block.

### Code Snippet:
{fenced("python", program + chr(10) + "f(<|YOUR INPUT WILL BE PLUGGED HERE|>)")}
"""


def solve_output(task: Task) -> str:
    """code_o solver: program and input shown, the output asked in an ```output block."""
    return f"""# Task: Deduce the Output of a Python Code Snippet Given the Code and Input
Given the code snippet and the input below, think step by step, then deduce the output that plugging the input into \
the snippet produces. Put your output in an ```output block. If the output is a string, wrap it in quotes; if the \
function returns several values, wrap them in a tuple.

# Code Snippet:
{fenced("python", task.program)}

# Input:
{fenced("input", task.inputs[0])}

# Example Output:
{fenced("output", "{'age': 20, 'city': 'New York'}")}
"""


def solve_input(task: Task) -> str:
    """code_i solver: program and output shown, one input asked in an ```input block."""
    return f"""# Task: Provide One Possible Input of a Python Code Snippet Given the Code and Output
Given the code snippet and the output below, think step by step, then provide one possible input that produces the \
output. Put the input in an ```input block. If an argument is a string, wrap it in quotes; separate multiple \
arguments with commas.

# Code Snippet:
{fenced("python", task.program)}

# Output:
{fenced("output", task.outputs[0])}

# Output Format:
{fenced("input", "arg1, arg2, ...")}
# Example Output:
{fenced("input", _EXAMPLE_INPUT)}
"""


def solve_function(task: Task, n_shown: int) -> str:
    """code_f solver: the first ``n_shown`` input/output pairs and the message; a program asked in ```python."""
    pairs = "\n".join(fenced(f"input_{i}", inp) + "\n" + fenced(f"output_{i}", out)
                      for i, (inp, out) in enumerate(zip(task.inputs[:n_shown], task.outputs[:n_shown])))
    return f"""# Task: Deduce the Function that Produced the Outputs from the Inputs
Given the input/output pairs and the message describing the function below, think step by step to deduce a general \
code snippet. It must also produce the hidden outputs from the hidden inputs, matching the code that generated the \
pairs. Working through each pair to test your function helps; if it does not work as expected, revise it until it \
does. Your final answer is the code snippet in a ```python block: that is what is evaluated.

# Code Requirements:
{_CODE_REQUIREMENTS}

# Input and Output Pairs:
{pairs}

# Message:
{fenced("message", task.message)}

# Example Output:
{fenced("python", "def f(a):" + chr(10) + "    return a")}

Name your entry function `f()`!!!
"""
