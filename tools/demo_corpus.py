"""The demo model's training text: small stories, dialogue, plain facts and chat exchanges.

Everything is built from the word lists and templates below with a seeded RNG, so the text is
reproducible byte for byte (`random.Random` with an int seed gives the same stream on every
Python 3 version) and owes nothing to anyone else's writing. The training corpus and the
held-out text are the same generator under different seeds.

    documents(count, seed)        plain-text documents: stories, dialogue, facts
    chat_documents(count, seed)   ChatML exchanges, rendered as the shipped chat template renders them
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

TRAIN_SEED = 2024
CHAT_SEED = 2025
HELDOUT_SEED = 7


@dataclass(frozen=True)
class Character:
    name: str
    kind: str         # girl / boy
    subject: str      # she / he
    object: str       # her / him
    possessive: str   # her / his


def _people(names: str, kind: str, pronouns: tuple[str, str, str]) -> list[Character]:
    return [Character(name, kind, *pronouns) for name in names.split()]


CHARACTERS = (
    _people("Anna Mia Lily Sara Nora Ella Rosa Ivy Maya Lucy Hana Zoe Clara Emma Ruby Alice Grace Julia "
            "Amelia Chloe Daisy Eva Fiona Helen Iris Jane Kate Laura Molly Nina Olivia Pia Quinn Rita "
            "Sophie Tara Una Vera Wendy Yara", "girl", ("she", "her", "her"))
    + _people("Tom Leo Ben Sam Max Jack Omar Finn Noah Adam Eli Hugo Oscar Theo Luke Felix Ravi Peter "
              "Aaron Bruno Carl David Ethan Frank George Henry Ivan James Kevin Liam Martin Nick Owen "
              "Paul Rory Simon Tim Victor Will", "boy", ("he", "him", "his"))
)
RELATIVES = ["mother", "father", "grandmother", "grandfather", "aunt", "uncle", "big sister", "big brother"]
JOBS = ["baker", "farmer", "teacher", "doctor", "sailor", "painter", "fisherman", "carpenter", "nurse",
        "pilot", "gardener", "tailor", "librarian", "postman", "cook", "driver", "builder", "singer",
        "shopkeeper", "miller", "potter", "blacksmith", "shepherd", "beekeeper"]
ACTIVITIES = ["read books", "paint pictures", "climb trees", "bake cakes", "play the piano",
              "ride a bicycle", "fly kites", "swim in the lake", "plant seeds", "draw maps",
              "collect shells", "watch the stars", "sing songs", "build sandcastles", "feed the ducks",
              "write letters", "dance in the kitchen", "play football", "knit scarves", "fix old clocks",
              "count the clouds", "pick berries", "tell jokes", "make paper birds", "learn new words"]
CHARACTER_TRAITS = ["kind", "clever", "quiet", "funny", "shy", "brave", "busy", "gentle", "cheerful",
                    "careful", "curious", "little", "tall", "young", "friendly", "patient"]

ANIMALS = ["cat", "dog", "fox", "owl", "rabbit", "bear", "duck", "horse", "mouse", "frog", "goat",
           "sheep", "squirrel", "turtle", "hedgehog", "deer", "wolf", "robin", "pig", "cow", "eagle",
           "otter", "badger", "goose", "lamb", "kitten", "puppy", "donkey", "swan", "beaver"]
ANIMAL_SOUNDS = {"cat": "meowed", "dog": "barked", "fox": "yipped", "owl": "hooted", "duck": "quacked",
                 "horse": "neighed", "mouse": "squeaked", "frog": "croaked", "goat": "bleated",
                 "sheep": "bleated", "wolf": "howled", "robin": "sang", "pig": "grunted", "cow": "mooed",
                 "goose": "honked", "lamb": "bleated", "kitten": "mewed", "puppy": "yapped",
                 "donkey": "brayed", "eagle": "screeched"}
ANIMAL_HOMES = {"rabbit": "a hole under the hedge", "bear": "a cave in the hills", "owl": "a hollow tree",
                "fox": "a den near the river", "duck": "a nest by the pond", "mouse": "a hole in the wall",
                "squirrel": "a nest in the oak tree", "frog": "the edge of the pond",
                "turtle": "the muddy bank", "hedgehog": "a pile of leaves", "deer": "the deep woods",
                "wolf": "the dark forest", "robin": "a nest in the apple tree", "otter": "the reeds",
                "badger": "a burrow under the roots", "beaver": "a lodge of sticks", "swan": "the lake",
                "eagle": "a nest on the cliff"}

PLACES = ["the market", "the forest", "the beach", "the library", "the garden", "the village",
          "the top of the hill", "the kitchen", "the school", "the harbour", "the old mill", "the farm",
          "the river bank", "the park", "the bakery", "the station", "the lake", "the meadow",
          "the museum", "the castle", "the bridge", "the orchard", "the city square", "the mountain path",
          "the lighthouse", "the zoo", "the post office", "the playground", "the island", "the valley",
          "the barn", "the cave", "the pond", "the fair", "the toy shop", "the church", "the tower"]
THING_ADJECTIVES = ["red", "blue", "green", "yellow", "purple", "old", "new", "small", "big", "shiny",
                    "wooden", "soft", "heavy", "tiny", "strange", "beautiful", "broken", "golden",
                    "silver", "striped", "round", "secret", "magic", "dusty", "warm", "bright"]
THING_NOUNS = ["ball", "kite", "map", "key", "coat", "stone", "glove", "coin", "box", "hat", "bell",
               "umbrella", "boat", "lamp", "clock", "book", "basket", "cup", "scarf", "shell", "ribbon",
               "whistle", "drum", "flute", "candle", "mirror", "compass", "blanket", "bicycle", "feather",
               "letter", "jar", "spoon", "kettle", "button", "ring", "pencil", "bucket", "sock", "wagon"]
FOODS = ["soup", "bread", "cake", "apple pie", "cheese", "rice", "carrots", "cherries", "pancakes",
         "porridge", "biscuits", "plums", "beans", "potatoes", "honey cake", "fish", "noodles",
         "strawberries", "eggs", "tomato salad", "hot milk", "lemon tart"]
OPENINGS = ["One sunny morning", "On a rainy day", "Late one evening", "In the middle of winter",
            "Early in the spring", "One cold night", "On a warm summer afternoon", "Long ago",
            "One day", "Last week", "At the end of the autumn", "On a foggy morning", "Once upon a time",
            "On a windy Sunday", "After breakfast", "Before the sun came up", "On the first day of May"]
FEELINGS = ["happy", "sad", "tired", "curious", "worried", "proud", "excited", "surprised", "calm",
            "afraid", "hungry", "sleepy", "brave", "lonely", "cheerful", "grateful", "nervous", "glad"]
WEATHER = ["The sky was clear and blue.", "The wind was cold.", "Rain tapped on the windows.",
           "The sun was warm on the grass.", "Snow covered the roofs.", "The air smelled of flowers.",
           "Grey clouds moved across the sky.", "Leaves fell from the trees.", "The moon was bright.",
           "Birds were singing in the hedges.", "Thick fog hid the fields.", "A rainbow hung over the hills.",
           "The streets were quiet.", "Frost sparkled on the windows."]
PROBLEMS = ["the path was blocked by a fallen tree", "the door was locked", "it started to rain",
            "{name} could not find the way back", "the bridge was closed", "a strong wind blew",
            "the shop was already closed", "the river was too deep to cross", "it was getting dark",
            "{subj} had lost {poss} way in the fog", "the wheel of {poss} cart broke",
            "a big dog stood in the road", "{poss} shoes were wet and cold", "the last bus had gone"]
SOLUTIONS = ["{friend} showed {obj} a shorter way", "{subj} waited until the sun came out",
             "{subj} asked a kind old woman for help", "{friend} found a key under a stone",
             "{subj} walked around the long way", "{friend} lent {obj} a lamp",
             "{subj} sang a song and kept going", "{friend} built a small raft",
             "{subj} followed the lights of the village", "{friend} gave {obj} a pair of dry socks",
             "{friend} knew a path through the trees", "{subj} counted to ten and tried again",
             "a farmer gave them a ride in his cart", "{friend} fixed it with a piece of string"]
ENCOURAGEMENTS = ["Do not worry", "Come with me", "I can help", "Look over there", "Let us try together",
                  "Be brave", "We can do it", "Follow me", "Wait a moment"]
ENDINGS = ["In the end, everyone was happy.", "{Name} smiled all the way home.",
           "That night, {name} slept well.", "It was the best day of the year.",
           "{Name} never forgot that day.", "Then they went home for dinner.",
           "They promised to meet again the next day.", "And that is how {name} made a new friend.",
           "From that day on, {name} and {friend} were the best of friends.",
           "The next morning, {subj} told everyone at school about it."]

GREETINGS = ["Hello", "Good morning", "Hi", "Good evening", "Hey", "Good afternoon"]
QUESTIONS = [("Where are you going?", ["I am going to {place}.", "I am on my way to {place}."]),
             ("What are you carrying?", ["I am carrying {thing}.", "It is {thing}."]),
             ("How are you today?", ["I am {feeling}, thank you.", "I feel {feeling} today."]),
             ("Have you seen my {animal}?", ["Yes, it ran to {place}.", "No, I have not seen it."]),
             ("Do you want to come with me?", ["Yes, I would love to.", "Not today, I am {feeling}."]),
             ("What did you find?", ["I found {thing} near {place}."]),
             ("Can you help me?", ["Of course I can help you.", "Yes, what do you need?"]),
             ("Where do you live?", ["I live near {place}."]),
             ("What time is it?", ["It is {hour} o'clock."]),
             ("What do you like to do?", ["I like to {activity}.", "I love to {activity}."]),
             ("What is for dinner?", ["We are having {food}.", "I think it is {food}."]),
             ("What does your {relative} do?", ["My {relative} is a {job}."])]
FAREWELLS = ["Goodbye", "See you tomorrow", "Take care", "See you later", "Good night", "Have a nice day"]
HOURS = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve"]

FACTS = ["The sun is a star.", "Water freezes when it is very cold.", "Fish live in water.",
         "Birds build nests in trees.", "Bees make honey.", "The moon goes around the earth.",
         "Plants need light and water to grow.", "Ice melts in the sun.", "Cows give milk.",
         "A week has seven days.", "A year has twelve months.", "The sky is blue on a clear day.",
         "Snow is cold and white.", "Bread is made from flour.", "Apples grow on trees.",
         "Rain falls from the clouds.", "A triangle has three sides.", "A square has four sides.",
         "Owls hunt at night.", "Frogs can jump far.", "Rivers flow to the sea.", "Grass is green.",
         "Fire is hot.", "Spiders have eight legs.", "Dogs like to run and play.", "Cats like to sleep.",
         "Winter is the coldest season.", "Summer is the warmest season.", "Sheep give us wool.",
         "Trees lose their leaves in the autumn.", "The earth goes around the sun.",
         "A day has twenty four hours.", "Ducks can swim and fly.", "Wood floats on water.",
         "Stones sink in water.", "Carrots grow under the ground."]
NUMBERS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
COLORS = {"the sky": "blue", "grass": "green", "snow": "white", "a lemon": "yellow", "a tomato": "red",
          "coal": "black", "an orange": "orange", "a plum": "purple", "the sun": "yellow", "milk": "white",
          "a leaf": "green", "a strawberry": "red", "a crow": "black", "a banana": "yellow"}


def with_article(noun: str) -> str:
    return ("an " if noun[0] in "aeiou" else "a ") + noun


def _said(sentence: str) -> str:
    """A quoted sentence before 'said X': its final full stop becomes a comma."""
    return sentence[:-1] + "," if sentence.endswith(".") else sentence


def _capitalize(text: str) -> str:
    return text[0].upper() + text[1:]


def _thing(rng: random.Random) -> str:
    return with_article(f"{rng.choice(THING_ADJECTIVES)} {rng.choice(THING_NOUNS)}")


def _fill(template: str, rng: random.Random, hero: Character, friend: Character) -> str:
    """Fill a template's slots: hero's name and pronouns, the friend, and random words."""
    return _capitalize(template.format(
        name=hero.name, Name=hero.name, subj=hero.subject, obj=hero.object, poss=hero.possessive,
        friend=friend.name, place=rng.choice(PLACES), thing=_thing(rng), feeling=rng.choice(FEELINGS),
        animal=rng.choice(ANIMALS), hour=rng.choice(HOURS), activity=rng.choice(ACTIVITIES),
        food=rng.choice(FOODS), relative=rng.choice(RELATIVES), job=rng.choice(JOBS)))


def _introduction(rng: random.Random, hero: Character) -> str:
    trait, relative = rng.choice(CHARACTER_TRAITS), rng.choice(RELATIVES)
    return rng.choice([
        f"{hero.name} was {with_article(trait)} {hero.kind} who liked to {rng.choice(ACTIVITIES)}.",
        f"{hero.name} lived with {hero.possessive} {relative}, who was {with_article(rng.choice(JOBS))}.",
        (f"{hero.name} was {with_article(trait)} {hero.kind}. {_capitalize(hero.subject)} loved to "
         f"{rng.choice(ACTIVITIES)}."),
    ])


def _meeting(rng: random.Random, hero: Character, animal: str) -> list[str]:
    s = hero.subject
    sound = ANIMAL_SOUNDS.get(animal)
    lines = [f"On the way, {s} met {with_article(animal)}. The {animal} {sound} and {s} laughed." if sound
             else f"On the way, {s} saw {with_article(animal)} near {rng.choice(PLACES)}."]
    if animal in ANIMAL_HOMES and rng.random() < 0.5:
        lines.append(f"The {animal} lived in {ANIMAL_HOMES[animal]}.")
    return lines


def story(rng: random.Random, hero: Character | None = None, animal: str | None = None) -> str:
    """A short story: who, where, a goal, an animal met, a problem, a friend's help, an ending."""
    hero = hero or rng.choice(CHARACTERS)
    friend = rng.choice([c for c in CHARACTERS if c != hero])
    animal = animal or rng.choice(ANIMALS)
    place, adjective, noun = rng.choice(PLACES), rng.choice(THING_ADJECTIVES), rng.choice(THING_NOUNS)
    thing = with_article(f"{adjective} {noun}")
    s, p = _capitalize(hero.subject), hero.possessive
    lines = [f"{rng.choice(OPENINGS)}, {hero.name} went to {place}."]
    if rng.random() < 0.6:
        lines.append(_introduction(rng, hero))
    lines.append(rng.choice(WEATHER))
    lines.append(rng.choice([f"{s} wanted to find {thing}.", f"{s} was looking for {thing}.",
                             f"{s} took {thing} with {hero.object}."]))
    lines += _meeting(rng, hero, animal)
    lines.append("But " + rng.choice(PROBLEMS).format(name=hero.name, subj=hero.subject, poss=p) + ".")
    lines.append(f"{hero.name} felt {rng.choice(FEELINGS)}.")
    lines.append(f'{friend.name} said, "{rng.choice(ENCOURAGEMENTS)}, {hero.name}."')
    lines.append(_fill(rng.choice(SOLUTIONS), rng, hero, friend) + ".")
    lines.append(rng.choice([f"At last, {hero.subject} found the {adjective} {noun} and put it in {p} bag.",
                             f"At last, {hero.subject} reached {place}.",
                             (f"When {hero.subject} came home, {p} {rng.choice(RELATIVES)} made "
                              f"{rng.choice(FOODS)} for dinner.")]))
    lines.append(_fill(rng.choice(ENDINGS), rng, hero, friend))
    return " ".join(lines)


def dialogue(rng: random.Random) -> str:
    """Two characters greet each other, trade two questions and say goodbye."""
    a, b = rng.sample(CHARACTERS, 2)
    lines = [f'"{rng.choice(GREETINGS)}, {b.name}," said {a.name}.',
             f'"{rng.choice(GREETINGS)}, {a.name}," said {b.name}.']
    for question, answers in rng.sample(QUESTIONS, 2):
        asker, answerer = (a, b) if rng.random() < 0.5 else (b, a)
        question = _fill(question, rng, asker, answerer)
        lines.append(f'"{question}" asked {asker.name}.')
        lines.append(f'"{_said(_fill(rng.choice(answers), rng, answerer, asker))}" said {answerer.name}.')
    lines.append(f'"{rng.choice(FAREWELLS)}!" said {a.name}, and {a.subject} walked to {rng.choice(PLACES)}.')
    return "\n".join(lines)


def facts(rng: random.Random) -> str:
    """A few plain facts, a colour and a small sum, in random order."""
    picked = rng.sample(FACTS, 3)
    thing, color = rng.choice(list(COLORS.items()))
    x, y = rng.randint(0, 5), rng.randint(0, 5)
    picked.append(f"The colour of {thing} is {color}.")
    picked.append(f"{NUMBERS[x].capitalize()} and {NUMBERS[y]} make {NUMBERS[x + y]}.")
    rng.shuffle(picked)
    return " ".join(picked)


def documents(count: int, seed: int) -> list[str]:
    """`count` plain-text documents: about 60% stories, 25% dialogue, 15% facts.

    The list for a larger count starts with the list for a smaller one (same seed).
    """
    rng = random.Random(seed)
    makers = [story] * 12 + [dialogue] * 5 + [facts] * 3
    return [rng.choice(makers)(rng) for _ in range(count)]


def _chat_turn(rng: random.Random) -> tuple[str, str]:
    kind = rng.randrange(6)
    if kind == 0:
        hero = rng.choice(CHARACTERS)
        return f"Tell me a story about {hero.name}.", story(rng, hero=hero)
    if kind == 1:
        animal = rng.choice(ANIMALS)
        return f"Tell me a story about {with_article(animal)}.", story(rng, animal=animal)
    if kind == 2:
        thing, color = rng.choice(list(COLORS.items()))
        return f"What colour is {thing}?", f"The colour of {thing} is {color}."
    if kind == 3:
        x, y = rng.randint(0, 5), rng.randint(0, 5)
        return (f"What is {NUMBERS[x]} and {NUMBERS[y]}?",
                f"{NUMBERS[x].capitalize()} and {NUMBERS[y]} make {NUMBERS[x + y]}.")
    if kind == 4:
        fact = rng.choice(FACTS)
        return "Tell me a fact.", fact
    return (rng.choice(["Hello!", "Hi!", "Good morning!", "Hello, who are you?", "Who are you?"]),
            rng.choice(["Hello! I am a small demo model. I can tell you a short story.",
                        "Hi! Ask me for a story about a cat, a fox or a friend.",
                        "Good day! I know small stories and simple facts."]))


def chat_documents(count: int, seed: int) -> list[str]:
    """`count` one-turn ChatML exchanges, exactly as the shipped chat template renders them."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        user, assistant = _chat_turn(rng)
        out.append(f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n{assistant}<|im_end|>\n")
    return out


def unigram_perplexity(train_ids: list[int], eval_ids: list[list[int]], vocab_size: int) -> float:
    """The baseline the demo model must beat: a unigram model of `train_ids` with add-one
    smoothing over the whole vocabulary, scored on every id of every `eval_ids` sequence."""
    counts = [1] * vocab_size
    for token in train_ids:
        counts[token] += 1
    total = sum(counts)
    nll = [math.log(total / counts[token]) for ids in eval_ids for token in ids]
    return math.exp(sum(nll) / len(nll))
