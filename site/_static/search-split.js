// Sphinx 9.0's Chinese language_data.js sets `Stemmer = ChineseStemmer` but defines only the EnglishStemmer it uses
// for Latin words: this script loads first and names one that builds the other.
var ChineseStemmer = function () {
  return new EnglishStemmer();
};

// Chinese queries for Sphinx's search: a run of Chinese characters has no spaces, so it is cut into the longest
// words the index holds (the index was segmented by jieba at build time), e.g. 梯度累积步数 -> 梯度累积, 步数.
var splitQuery = (query) => {
  const terms = typeof Search !== "undefined" && Search._index ? Search._index.terms : {};
  const longest = (run) => {
    const words = [];
    for (let i = 0; i < run.length; ) {
      let n = Math.min(8, run.length - i);
      while (n > 1 && !(run.slice(i, i + n) in terms)) n--;
      if (run.slice(i, i + n) in terms) words.push(run.slice(i, i + n));
      i += n;
    }
    return words.length ? words : [run];
  };
  return query
    .split(/[^\p{Letter}\p{Number}_\p{Emoji_Presentation}]+/gu)
    .filter((term) => term)
    .flatMap((term) => term.split(/(\p{Script=Han}+)/u).filter((t) => t))
    .flatMap((t) => (/\p{Script=Han}/u.test(t) ? longest(t) : [t]));
};
