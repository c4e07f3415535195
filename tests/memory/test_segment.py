from memory.retrieval.segment import MAX_PARAGRAPH_SIZE, segment, text_size

ENGLISH = """# Building permits

A building permit is a decision by the municipality. It is needed for new houses.

It takes ten weeks. Complex cases take twenty.

## Fees

Fees follow the municipal tariff:
- a house costs more
- a shed costs less

# Heating

Heat pumps save energy.
"""

CHINESE = """# 建筑许可

建筑许可是市政府的决定。新建房屋需要许可。

审批需要十周。复杂的情况需要二十周！

## 费用

费用按照市政收费标准计算。
"""


def test_english_sections_paragraphs_and_sentences():
    result = segment(ENGLISH)
    titles = [(section.title, section.level) for section in result.sections]
    assert titles == [("", 0), ("Building permits", 1), ("Fees", 2), ("Heating", 1)]
    assert result.sections[2].parent == 1 and result.sections[3].parent == 0
    texts = [paragraph.text for paragraph in result.paragraphs]
    assert texts[0] == "A building permit is a decision by the municipality. It is needed for new houses."
    assert texts[2] == "Fees follow the municipal tariff:\n- a house costs more\n- a shed costs less"
    assert [paragraph.section for paragraph in result.paragraphs] == [1, 1, 2, 3]
    first = result.paragraphs[0]
    assert first.text[: first.sentence_ends[0]] == "A building permit is a decision by the municipality."
    assert result.section_path(2) == "Building permits > Fees"


def test_chinese_sections_and_sentences():
    result = segment(CHINESE)
    assert [section.title for section in result.sections] == ["", "建筑许可", "费用"]
    assert [paragraph.text for paragraph in result.paragraphs] == [
        "建筑许可是市政府的决定。新建房屋需要许可。",
        "审批需要十周。复杂的情况需要二十周！",
        "费用按照市政收费标准计算。",
    ]
    first = result.paragraphs[0]
    assert [first.text[:end] for end in first.sentence_ends] == ["建筑许可是市政府的决定。", first.text]


def test_long_block_is_cut_where_the_topic_shifts():
    cats = " ".join(f"Cats purr, sleep and chase mice in barn {i}." for i in range(15))
    rockets = " ".join(f"Rockets burn fuel to reach orbit from launchpad {i}." for i in range(15))
    result = segment(cats + " " + rockets)
    assert [paragraph.text.split()[0] for paragraph in result.paragraphs] == ["Cats", "Rockets"]
    assert all("Rockets" not in paragraph.text for paragraph in result.paragraphs[:1])


def test_text_without_punctuation_is_cut_to_size():
    for text in ["word " * 1000, "字" * 1000]:
        result = segment(text)
        assert len(result.paragraphs) > 1
        assert all(text_size(paragraph.text) <= MAX_PARAGRAPH_SIZE for paragraph in result.paragraphs)
        assert sum(text_size(paragraph.text) for paragraph in result.paragraphs) == 1000
